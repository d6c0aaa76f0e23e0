"""Tests generated from every rule's VALID/INVALID examples (Fixit's convention)."""

from __future__ import annotations

import pytest

from dplint import lint_source
from dplint.fixes import apply_fixes
from dplint.rules import ALL_RULES, CHECKS


def _cases(kind: str):
    for rule in ALL_RULES:
        for index, example in enumerate(getattr(rule, kind)):
            yield pytest.param(rule, example, id=f"{rule.code}-{kind.lower()}-{index}")


def _lint(rule, source):
    # DPL000 comes from the engine, not a check: lint with every rule and keep only its findings.
    select = [rule.code] if rule in CHECKS else None
    return [f for f in lint_source(source, "example.py", select=select) if f.code == rule.code]


@pytest.mark.parametrize("rule, example", list(_cases("VALID")))
def test_valid_example_is_silent(rule, example):
    assert _lint(rule, example.source) == []


@pytest.mark.parametrize("rule, example", list(_cases("INVALID")))
def test_invalid_example_is_reported_on_its_line(rule, example):
    findings = _lint(rule, example.source)
    assert [f.location.row for f in findings] == [example.line]
    finding = findings[0]
    assert finding.message.endswith(".") and len(finding.message) > 60
    if example.fixed_source is not None:
        assert finding.fix is not None
        assert apply_fixes(example.source, [finding]) == (example.fixed_source, [finding])


def test_codes_are_unique_and_well_formed():
    codes = [rule.code for rule in ALL_RULES]
    assert len(codes) == len(set(codes))
    names = [rule.name for rule in ALL_RULES]
    assert len(names) == len(set(names))
    for rule in ALL_RULES:
        assert rule.code.startswith("DPL") and len(rule.code) == 6 and rule.code[3:].isdigit()
        assert rule.name == rule.name.lower() and " " not in rule.name


@pytest.mark.parametrize("rule", ALL_RULES, ids=lambda r: r.code)
def test_every_rule_has_docs_and_examples(rule):
    docs = rule.docs()
    for heading in ("## What it does", "## Why is this bad?", "## Example", "## Use instead", "## Known problems"):
        assert heading in docs, f"{rule.code} docs lack {heading!r}"
    if not rule.runtime_only:  # runtime-only checks are exercised by tests/test_runtime.py
        assert len(rule.VALID) >= 3 and len(rule.INVALID) >= 3
    assert rule.summary.endswith(".")
