"""What is generated from the rule classes: `python -m dplint.docs dplint/rules.md dplint/codes.py`.

The rule reference (`.md`): `dplint --explain CODE` prints one rule's section of it, so the two never
disagree; it ships inside the package, and the links in findings point at the installed copy. The
codes module (`.py`): the codes, defaults, tiers and names that settings need, readable without
importing the rules.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Type

from dplint.rule import Rule

HEADER = """# dplint rule reference

Generated from the rule classes in `rules/` by `python -m dplint.docs dplint/rules.md`; a test fails
when this file is out of date. `dplint --explain CODE` prints the same text for one rule.

A preview rule runs only with `--preview` (or `preview = true` in `[tool.dplint]`): its precision on
real repositories is not yet measured at 0.95 or more.

"""
# The reference as installed: findings link to it (dplint has no web site; a link must lead somewhere).
REFERENCE = Path(__file__).with_name("rules.md")


def reference_url(code: str, name: str) -> Optional[str]:
    """A `file:` URI of the rule's section in the installed reference, or None when it is not installed."""
    if not REFERENCE.is_file():
        return None
    return f"{REFERENCE.as_uri()}#{code.lower()}-{name}"


def tier(rule: Type[Rule]) -> str:
    return "preview" if rule.preview else "stable"


def _shift_headings(markdown: str, levels: int) -> str:
    """Demote the Markdown headings of a rule's docs, leaving `#` comments inside code blocks alone."""
    lines, fenced = [], False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            line = "#" * levels + line
        lines.append(line)
    return "\n".join(lines)


def _examples(title: str, examples: Sequence, level: int) -> List[str]:
    if not examples:
        return []
    parts = [f"{'#' * (level + 1)} {title}", ""]
    for example in examples:
        parts += ["```python", example.source.rstrip("\n"), "```", ""]
    return parts


WILD = Path(__file__).resolve().parent.parent / "bench" / "wild"


def _measurement(code: str) -> str:
    from dplint import codes

    counts = codes.WILD_FINDINGS.get(code)
    where = f"the {codes.WILD_REPOSITORIES} public repositories of `bench/wild/`"
    if counts is None:
        return f"Precision in the wild: no finding on {where}."
    findings, true, false, moot = counts
    unread = findings - true - false - moot
    precision = f"precision {true / (true + false):.2f}" if true + false else "no finding judged true or false"
    rest = f", {unread} not read" if unread else ""
    return (
        f"Precision in the wild: on {where}, {findings} findings; read by hand: {true} true, {false} false, "
        f"{moot} true but moot{rest}: {precision}."
    )


def wild_measurements() -> Tuple[int, Dict[str, Tuple[int, int, int, int]]]:
    """From `bench/wild/` (the hand labels `shared/tools/sweep.py` keeps): the number of repositories and,
    per code, (findings, true, false, true but moot)."""
    import csv

    repositories = [line for line in (WILD / "repos.txt").read_text().splitlines() if line.strip() and not line.startswith("#")]
    counts: Dict[str, List[int]] = {}
    with open(WILD / "labels.tsv", newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle, delimiter="\t"):
            tally = counts.setdefault(row["code"], [0, 0, 0, 0])
            tally[0] += 1
            for index, label in ((1, "TP"), (2, "FP"), (3, "DEB")):
                tally[index] += row["label"] == label
    return len(repositories), {code: tuple(values) for code, values in sorted(counts.items())}  # type: ignore[misc]


FIX_LINES = {
    (): "none.",
    ("safe",): "safe: `--fix` applies it.",
    ("unsafe",): (
        "unsafe: it changes behaviour, so `--fix` applies it only with `--unsafe-fixes`; `--diff --unsafe-fixes` "
        "shows it, and editors offer it as a code action."
    ),
    ("safe", "unsafe"): (
        "safe or unsafe, case by case (see Fix safety): `--fix` applies the safe ones, and the unsafe ones only "
        "with `--unsafe-fixes`."
    ),
}


def explain(rule: Type[Rule], level: int = 1) -> str:
    """One rule's documentation: summary, severity, its docs, and the examples its tests run."""
    if rule.runtime_only:
        state = "checked at runtime by `dplint.runtime` and the pytest plugin (`pytest --dplint`)"
    else:
        state = ("enabled" if rule.enabled_by_default else "disabled") + " by default"
        if rule.preview and rule.enabled_by_default:
            state = "enabled with --preview"
    tier_line = "Tier: preview — runs only with --preview." if rule.preview else "Tier: stable."
    if rule.preview and rule.preview_reason:
        tier_line += f" {rule.preview_reason}"
    tier_line += f"\n\nChecked on: {rule.checked_on}" if rule.runtime_only else f"\n\n{_measurement(rule.code)}"
    parts = [
        f"{'#' * level} {rule.code}: {rule.name}",
        "",
        rule.summary,
        "",
        f"Severity: {rule.severity}; {state}.",
        "",
        tier_line,
        "",
        f"Fix: {FIX_LINES[rule.fix_applicability]}",
        "",
        _shift_headings(rule.docs(), level - 1),
        "",
    ]
    parts += _examples("Reported (from the tests)", rule.INVALID, level)
    parts += _examples("Not reported (from the tests)", rule.VALID, level)
    return "\n".join(parts).rstrip("\n") + "\n"


def reference() -> str:
    from dplint.rules import ALL_RULES

    table = ["| code | name | severity | checked | tier | summary |", "|---|---|---|---|---|---|"]
    for rule in ALL_RULES:
        checked = "runtime" if rule.runtime_only else "static" if rule.enabled_by_default else "static, off by default"
        anchor = f"#{rule.code.lower()}-{rule.name}"
        table.append(f"| [{rule.code}]({anchor}) | {rule.name} | {rule.severity} | {checked} | {tier(rule)} | {rule.summary} |")
    sections = [explain(rule, level=2) for rule in ALL_RULES]
    return HEADER + "\n".join(table) + "\n\n" + "\n".join(sections)


CODES_HEADER = '''"""The rule codes, generated from the rule classes by `python -m dplint.docs dplint/codes.py` (a
test fails when it is out of date). Settings need only these, so a run answered from the cache
never imports the rules, nor libcst.
"""
'''


def codes_module() -> str:
    from dplint.rules import ALL_RULES, CHECKS, RUNTIME_ONLY

    lines = [CODES_HEADER, "# The codes checked in source files, in the engine's order: whether each is on by default."]
    lines += ["STATIC_CODES = {"] + [f'    "{rule.code}": {rule.enabled_by_default},' for rule in CHECKS] + ["}"]
    lines += ["# The codes that only the runtime hooks check.", "RUNTIME_ONLY_CODES = frozenset({"]
    lines += [f'    "{rule.code}",' for rule in RUNTIME_ONLY] + ["})"]
    lines += ["# The static codes that run only with --preview (or `preview = true`).", "PREVIEW_CODES = frozenset({"]
    lines += [f'    "{rule.code}",' for rule in CHECKS if rule.preview] + ["})"]
    lines += ["# Every rule's name and its code: a name is accepted wherever a code is.", "CODES_BY_NAME = {"]
    lines += [f'    "{rule.name}": "{rule.code}",' for rule in ALL_RULES] + ["}"]
    repositories, findings = wild_measurements()
    lines += [
        "# Precision in the wild, from the hand labels in bench/wild/labels.tsv: the repositories swept, and per",
        "# code (findings, true, false, true but moot).",
        f"WILD_REPOSITORIES = {repositories}",
        "WILD_FINDINGS = {",
    ]
    lines += [f'    "{code}": {counts},' for code, counts in findings.items()] + ["}", ""]
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    paths = list(sys.argv[1:] if argv is None else argv)
    if not paths or not all(path.endswith((".md", ".py")) for path in paths):
        print("usage: python -m dplint.docs dplint/rules.md dplint/codes.py", file=sys.stderr)
        return 2
    # The codes module first: the reference quotes its measurements.
    for path in sorted(paths, key=lambda path: path.endswith(".md")):
        text = reference() if path.endswith(".md") else codes_module()  # before the file is emptied: the rules read the codes
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
        if path.endswith(".py"):
            import importlib

            import dplint.codes

            importlib.reload(dplint.codes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
