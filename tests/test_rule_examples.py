"""Tests generated from every rule's VALID/INVALID examples (Fixit's convention)."""

from __future__ import annotations

from collections import Counter

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
    # `--list-rules` and `--explain` show the declared applicabilities: every fix offered has one of them.
    assert finding.fix is None or finding.fix.applicability in rule.fix_applicability
    if example.fixed_source is not None:
        assert finding.fix is not None
        assert apply_fixes(example.source, [finding], unsafe=True) == (example.fixed_source, [finding])


def _fixed_cases():
    for rule in ALL_RULES:
        for index, example in enumerate(rule.INVALID):
            if example.fixed_source is not None:
                yield pytest.param(rule, example, id=f"{rule.code}-invalid-{index}")


@pytest.mark.parametrize("rule, example", list(_fixed_cases()))
def test_a_fixed_example_compiles_and_leaves_no_finding_and_no_new_one(rule, example):
    """What a fix promises: the result parses, the finding is gone on a re-run (so `--fix` is
    idempotent), and no rule, preview ones included, finds anything it did not find before."""
    compile(example.fixed_source, "example.py", "exec")
    assert _lint(rule, example.fixed_source) == []
    everything = [rule.code for rule in CHECKS]
    before = Counter(f.code for f in lint_source(example.source, "example.py", select=everything))
    after = Counter(f.code for f in lint_source(example.fixed_source, "example.py", select=everything))
    assert not after - (before - Counter([rule.code]))  # (Counter's <= needs Python 3.10)


@pytest.mark.parametrize("rule", [rule for rule in ALL_RULES if rule.fix_applicability or any(e.expected_fix for e in rule.INVALID)], ids=lambda r: r.code)
def test_every_applicability_a_rule_declares_is_shown_by_a_fixed_example(rule):
    shown = set()
    for example in rule.INVALID:
        if example.fixed_source is not None:
            (finding,) = _lint(rule, example.source)
            shown.add(finding.fix.applicability)
    assert sorted(shown) == sorted(rule.fix_applicability)


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


def _guarded_patterns():
    import importlib
    import pkgutil

    import dplint.rules
    from dplint.analysis.patterns import GuardedPattern

    found = {}
    modules = ["dplint.analysis.facts"] + [f"dplint.rules.{info.name}" for info in pkgutil.iter_modules(dplint.rules.__path__)]
    for module_name in modules:
        for name, value in vars(importlib.import_module(module_name)).items():
            if isinstance(value, GuardedPattern):
                found.setdefault(id(value), (f"{module_name.rpartition('.')[2]}.{name}", value))
    for rule in CHECKS:
        for name in ("triggers", "requires"):
            if isinstance(getattr(rule, name), GuardedPattern):
                found.setdefault(id(getattr(rule, name)), (f"{rule.code}.{name}", getattr(rule, name)))
    return list(found.values())


def _corpus():
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    texts = [example.source for rule in ALL_RULES for example in (*rule.VALID, *rule.INVALID)]
    texts += [path.read_text() for folder in ("fixtures", "tests/distributed_programs") for path in (root / folder).rglob("*.py")]
    return texts


@pytest.mark.parametrize("where, pattern", list(_guarded_patterns()), ids=lambda value: value if isinstance(value, str) else "")
def test_a_guarded_pattern_matches_only_where_one_of_its_words_is(where, pattern):
    """A guard word missing from a match would hide real findings: the words must be in every match,
    a `one_line` pattern's matches must lie within a line, and the guarded search must find exactly
    what the regex finds alone."""
    matched = 0
    for text in _corpus():
        for match in pattern.regex.finditer(text):
            matched += 1
            assert any(word in match.group(0) for word in pattern.words), (where, match.group(0))
            assert not pattern.one_line or "\n" not in match.group(0), (where, match.group(0))
        assert [m.span() for m in pattern.finditer(text)] == [m.span() for m in pattern.regex.finditer(text)], where
    assert matched, f"{where} matches nothing in the examples and fixtures: the test proves nothing"


def test_collective_calls_are_the_matches_of_their_regex():
    """`CollectiveCalls` looks for calls from the names that end them: it must find exactly what its
    regex finds, tried at every position."""
    from dplint.analysis.ddp import CollectiveCalls

    tricky = """
import torch.distributed as dist
from torch.distributed import all_reduce as ar, barrier
from torch.distributed import *
dist.all_reduce(x); torch.distributed.barrier ( ); ar(x); barrier(); reduce(x)
x.all_reduce(y); myall_reduce(x); dist.all_reduce(x).wait(); dist.all_reduce
(dist.broadcast(t, 0), dist.reduce_scatter(o, i)); é.gather(x); dist.gather_object(x)
"""
    checked = 0
    for text in [*_corpus(), tricky]:
        calls = CollectiveCalls(text)
        expected = [(m.start(), m.end()) for m in calls.regex.finditer(text)]
        assert [(m.start(), m.end()) for m in calls.finditer(text)] == expected, text[:200]
        checked += len(expected)
    assert checked > 10
