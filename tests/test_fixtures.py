"""The bundled example programs: `dplint --preview fixtures/` must print exactly the findings beside each
file (with the preview rules, so that the fixtures exercise every rule); `dplint fixtures/` those less
the preview rules'."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dplint.codes import PREVIEW_CODES
from dplint.rules import BY_CODE

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = sorted(p for p in (ROOT / "fixtures").rglob("*.py") if not p.name.endswith(".fixed.py"))
EXPECTED = [line for f in FIXTURES for line in f.with_suffix(".txt").read_text().splitlines()]
FIXABLE = sum(" [*] " in line for line in EXPECTED)


def position(line: str):
    path, row, column = line.split(":")[:3]
    return path, int(row), int(column)


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'s' * (count != 1)}"


@pytest.fixture(scope="module")
def lint_output():
    completed = subprocess.run(
        [sys.executable, "-m", "dplint", "--no-cache", "--preview", "--format", "concise", "fixtures"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert completed.returncode == 1, completed.stderr
    assert completed.stderr == ""
    return completed.stdout.splitlines()


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda p: p.relative_to(ROOT / "fixtures").as_posix())
def test_fixture_findings_match_expected_file(fixture, lint_output):
    shown = fixture.relative_to(ROOT).as_posix()
    actual = [line for line in lint_output if line.startswith(shown + ":")]
    expected = fixture.with_suffix(".txt").read_text().splitlines()
    assert actual == expected


def test_every_fixture_has_an_expected_file_and_the_summary_counts_them(lint_output):
    assert FIXTURES and all(f.with_suffix(".txt").is_file() for f in FIXTURES)
    assert [line for line in lint_output if line.startswith("fixtures/")] == sorted(EXPECTED, key=position)
    errors, warnings = (sum(BY_CODE[line.split()[1]].severity == severity for line in EXPECTED) for severity in ("error", "warning"))
    counted = " and ".join([plural(errors, "error")] * bool(errors) + [plural(warnings, "warning")] * bool(warnings))
    files = len({line.split(":")[0] for line in EXPECTED})
    assert lint_output[-2:] == [f"Found {counted} in {plural(files, 'file')}.", f"[*] {FIXABLE} fixable with the `--fix` option."]


def test_fix_gives_the_expected_files_and_is_idempotent(tmp_path):
    copies = {fixture: tmp_path / fixture.relative_to(ROOT / "fixtures") for fixture in FIXTURES}
    for fixture, copy in copies.items():
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_bytes(fixture.read_bytes())
    command = [sys.executable, "-m", "dplint", "--no-cache", "--preview", "--fix", "."]
    first = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True)
    assert f"Fixed {plural(FIXABLE, 'finding')} ({len(EXPECTED) - FIXABLE} remaining)." in first.stderr
    for fixture, copy in copies.items():
        fixed = fixture.with_name(fixture.stem + ".fixed.py")
        assert copy.read_text() == (fixed if fixed.exists() else fixture).read_text(), fixture.name
    fixed_once = {p: p.read_bytes() for p in tmp_path.rglob("*.py")}
    second = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True)
    assert "Fixed" not in second.stderr
    assert {p: p.read_bytes() for p in tmp_path.rglob("*.py")} == fixed_once
    # What the fixes addressed is gone; only the findings without a fix remain.
    assert " [*] " not in second.stdout and second.stdout.count(": DPL") == len(EXPECTED) - FIXABLE


def test_default_run_reports_the_expected_findings_less_the_preview_rules():
    # The README's quick start: `dplint fixtures/` without --preview, which CI requires to exit 1.
    completed = subprocess.run(
        [sys.executable, "-m", "dplint", "--no-cache", "--format", "concise", "fixtures"], cwd=ROOT, capture_output=True, text=True
    )
    assert completed.returncode == 1 and completed.stderr == ""
    stable = [line for line in sorted(EXPECTED, key=position) if line.split()[1] not in PREVIEW_CODES]
    assert [line for line in completed.stdout.splitlines() if line.startswith("fixtures/")] == stable
    assert len(stable) < len(EXPECTED)  # the fixtures do exercise preview rules


def test_advice_rule_off_by_default_reports_its_fixture_when_selected():
    command = [sys.executable, "-m", "dplint", "--no-cache", "--format", "concise"]
    default = subprocess.run([*command, "fixtures/rnn_encoder.py"], cwd=ROOT, capture_output=True, text=True)
    assert default.returncode == 0
    selected = subprocess.run([*command, "--select", "DPL308", "fixtures/rnn_encoder.py"], cwd=ROOT, capture_output=True, text=True)
    assert [line.split(": ")[0] for line in selected.stdout.splitlines() if ": DPL" in line] == ["fixtures/rnn_encoder.py:17:21"]
