"""What is generated from the rule classes: `python -m dplint.docs docs/rules.md dplint/codes.py`.

The rule reference (`.md`): `dplint --explain CODE` prints one rule's section of it, so the two never
disagree. The codes module (`.py`): the codes and defaults that settings need, readable without
importing the rules.
"""

from __future__ import annotations

import sys
from typing import List, Optional, Sequence, Type

from dplint.rule import Rule

HEADER = """# dplint rule reference

Generated from the rule classes in `rules/` by `python -m dplint.docs docs/rules.md`; a test fails
when this file is out of date. `dplint --explain CODE` prints the same text for one rule.

"""


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


def explain(rule: Type[Rule], level: int = 1) -> str:
    """One rule's documentation: summary, severity, its docs, and the examples its tests run."""
    if rule.runtime_only:
        state = "checked at runtime by `dplint.runtime` and the pytest plugin (`pytest --dplint`)"
    else:
        state = ("enabled" if rule.enabled_by_default else "disabled") + " by default"
    parts = [
        f"{'#' * level} {rule.code}: {rule.name}",
        "",
        rule.summary,
        "",
        f"Severity: {rule.severity}; {state}.",
        "",
        _shift_headings(rule.docs(), level - 1),
        "",
    ]
    parts += _examples("Reported (from the tests)", rule.INVALID, level)
    parts += _examples("Not reported (from the tests)", rule.VALID, level)
    return "\n".join(parts).rstrip("\n") + "\n"


def reference() -> str:
    from dplint.rules import ALL_RULES

    table = ["| code | name | severity | checked | summary |", "|---|---|---|---|---|"]
    for rule in ALL_RULES:
        checked = "runtime" if rule.runtime_only else "static" if rule.enabled_by_default else "static, off by default"
        anchor = f"#{rule.code.lower()}-{rule.name}"
        table.append(f"| [{rule.code}]({anchor}) | {rule.name} | {rule.severity} | {checked} | {rule.summary} |")
    sections = [explain(rule, level=2) for rule in ALL_RULES]
    return HEADER + "\n".join(table) + "\n\n" + "\n".join(sections)


CODES_HEADER = '''"""The rule codes, generated from the rule classes by `python -m dplint.docs dplint/codes.py` (a
test fails when it is out of date). Settings need only these, so a run answered from the cache
never imports the rules, nor libcst.
"""
'''


def codes_module() -> str:
    from dplint.rules import CHECKS, RUNTIME_ONLY

    lines = [CODES_HEADER, "# The codes checked in source files, in the engine's order: whether each is on by default."]
    lines += ["STATIC_CODES = {"] + [f'    "{rule.code}": {rule.enabled_by_default},' for rule in CHECKS] + ["}"]
    lines += ["# The codes that only the runtime hooks check.", "RUNTIME_ONLY_CODES = frozenset({"]
    lines += [f'    "{rule.code}",' for rule in RUNTIME_ONLY] + ["})", ""]
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    paths = list(sys.argv[1:] if argv is None else argv)
    if not paths or not all(path.endswith((".md", ".py")) for path in paths):
        print("usage: python -m dplint.docs docs/rules.md dplint/codes.py", file=sys.stderr)
        return 2
    for path in paths:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(reference() if path.endswith(".md") else codes_module())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
