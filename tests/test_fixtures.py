"""The bundled example programs: `dplint fixtures/` must print exactly the findings beside each file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = sorted((ROOT / "fixtures").glob("*.py"))


@pytest.fixture(scope="module")
def lint_output():
    completed = subprocess.run(
        [sys.executable, "-m", "dplint", "--no-cache", "--format", "concise", "fixtures"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert completed.returncode == 1, completed.stderr
    assert completed.stderr == ""
    return completed.stdout.splitlines()


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda p: p.stem)
def test_fixture_findings_match_expected_file(fixture, lint_output):
    shown = f"fixtures/{fixture.name}"
    actual = [line for line in lint_output if line.startswith(shown + ":")]
    expected = fixture.with_suffix(".txt").read_text().splitlines()
    assert actual == expected


def test_every_fixture_has_an_expected_file_and_the_summary_counts_them(lint_output):
    assert FIXTURES and all(f.with_suffix(".txt").is_file() for f in FIXTURES)
    total = sum(len(f.with_suffix(".txt").read_text().splitlines()) for f in FIXTURES)
    assert len(lint_output) == total + 1
    assert lint_output[-1].startswith("Found ")
