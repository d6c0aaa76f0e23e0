"""The bundled example programs: `dplint fixtures/` must print exactly the findings beside each file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = sorted(p for p in (ROOT / "fixtures").rglob("*.py") if not p.name.endswith(".fixed.py") and "__pycache__" not in p.parts)
# Single-file fixtures; the fixture projects in subfolders (fixtures/ddp_project/) have no fixes.
SINGLE_FILE_FIXTURES = [p for p in FIXTURES if p.parent == ROOT / "fixtures"]


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


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda p: p.relative_to(ROOT / "fixtures").with_suffix("").as_posix())
def test_fixture_findings_match_expected_file(fixture, lint_output):
    shown = fixture.relative_to(ROOT).as_posix()
    actual = [line for line in lint_output if line.startswith(shown + ":")]
    expected = fixture.with_suffix(".txt").read_text().splitlines()
    assert actual == expected


def test_every_fixture_has_an_expected_file_and_the_summary_counts_them(lint_output):
    assert FIXTURES and all(f.with_suffix(".txt").is_file() for f in FIXTURES)
    expected = [line for f in FIXTURES for line in f.with_suffix(".txt").read_text().splitlines()]
    # Findings come sorted by path, then by line: the order of the files, each in line order.
    assert [line for line in lint_output if line.startswith("fixtures/")] == expected
    fixable = sum(" [*] " in line for line in expected)
    assert lint_output[-2:] == ["Found 35 errors and 1 warning in 18 files.", f"[*] {fixable} fixable with the `--fix` option."]


def test_fix_gives_the_expected_files_and_is_idempotent(tmp_path):
    for fixture in SINGLE_FILE_FIXTURES:
        (tmp_path / fixture.name).write_bytes(fixture.read_bytes())
    command = [sys.executable, "-m", "dplint", "--no-cache", "--fix", "."]
    first = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True)
    assert "Fixed 7 errors (16 remaining)." in first.stderr
    for fixture in SINGLE_FILE_FIXTURES:
        expected = fixture.with_name(fixture.stem + ".fixed.py")
        assert (tmp_path / fixture.name).read_text() == (expected if expected.exists() else fixture).read_text(), fixture.name
    fixed_once = {p.name: p.read_bytes() for p in tmp_path.glob("*.py")}
    second = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True)
    assert "Fixed" not in second.stderr
    assert {p.name: p.read_bytes() for p in tmp_path.glob("*.py")} == fixed_once
    # What the fixes addressed is gone; only the findings without a fix remain.
    assert " [*] " not in second.stdout and second.stdout.count(": DPL") == 16


def test_advice_rule_off_by_default_reports_its_fixture_when_selected():
    command = [sys.executable, "-m", "dplint", "--no-cache", "--format", "concise"]
    default = subprocess.run([*command, "fixtures/rnn_encoder.py"], cwd=ROOT, capture_output=True, text=True)
    assert default.returncode == 0
    selected = subprocess.run([*command, "--select", "DPL308", "fixtures/rnn_encoder.py"], cwd=ROOT, capture_output=True, text=True)
    assert [line.split(": ")[0] for line in selected.stdout.splitlines() if ": DPL" in line] == ["fixtures/rnn_encoder.py:17:21"]
