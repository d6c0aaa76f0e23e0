from __future__ import annotations

import re
from typing import Iterable, List, Optional, Sequence

from dplint.analysis.context import FileContext
from dplint.codes import STATIC_CODES
from dplint.finding import Edit, Finding, Fix, Location
from dplint.rule import Invalid, SuppressionRule, Valid
from dplint.noqa import NoqaCode, NoqaDirective, Suppressions
from dplint.rules.parse_error import ParseError
from dplint.rules.unknown_noqa_code import UnknownNoqaCode


class UnusedNoqa(SuppressionRule):
    """
    ## What it does
    Reports a `# noqa: CODE` comment whose DPL code suppresses nothing: the rule it names reports no
    finding on that line (or, for a statement's first line, in that statement). The fix removes the
    unused DPL codes and keeps the rest of the comment, other tools' codes included (`# noqa: E501,
    DPL301` becomes `# noqa: E501`). Disabled by default, like Ruff's RUF100: enable it with
    `--extend-select DPL001` or `extend-select = ["DPL001"]`.

    ## Why is this bad?
    A directive left behind after the code changed hides the next real finding on that line, and
    tells readers an exemption exists that no longer does.

    ## Example
    ```python
    x = x.to(device)  # noqa: DPL101
    ```

    ## Use instead
    ```python
    x = x.to(device)
    ```

    ## Known problems
    Only DPL codes are judged: a bare `# noqa` and other tools' codes may serve other linters, and
    codes of runtime checks (DPL3xx reported by the pytest plugin) cannot be judged statically. A
    named rule that the selection leaves out is still run on the file to decide, so the answer does
    not depend on the configuration. No fix is offered when text follows the codes in the comment
    (`# noqa: DPL101 - reason`): removing the codes would turn it into a different comment.
    File-level `# dplint: noqa` directives are not judged.
    """

    code = "DPL001"
    name = "unused-noqa"
    summary = "A `# noqa` comment names a DPL code that suppresses nothing on its line."
    fix_applicability = ("safe",)
    severity = "warning"
    enabled_by_default = False
    judges_use = True
    triggers = re.compile(r"#[ \t]*noqa[ \t]*:[^\n]*DPL", re.I)

    VALID = [
        Valid("import torch\nx = torch.zeros(3)\nx.to('cuda')  # noqa: DPL101\n"),
        Valid("import os  # noqa: E501, F401\nx = 1  # noqa\n"),
        Valid("loss = model(batch)  # noqa: DPL306\n"),
        Valid("import torch\nx = torch.zeros(3)\nx.to(  # noqa: DPL101\n    'cuda',\n)\n"),
    ]
    INVALID = [
        Invalid("import torch\nx = torch.zeros(3)\nx = x.to('cuda')  # noqa: DPL101\n", line=3,
                expected_fix="import torch\nx = torch.zeros(3)\nx = x.to('cuda')\n"),
        Invalid("import torch\nx = torch.zeros(3)\nx.to('cuda')  # noqa: DPL101, DPL202\n", line=3,
                expected_fix="import torch\nx = torch.zeros(3)\nx.to('cuda')  # noqa: DPL101\n"),
        Invalid("model = nn.DataParallel(model)  # type: ignore  # noqa: E501,DPL301\n", line=1,
                expected_fix="model = nn.DataParallel(model)  # type: ignore  # noqa: E501\n"),
        Invalid("x = x.to('cuda')  # noqa: DPL101 - moved above\n", line=1),
    ]

    def check_directives(self, ctx: FileContext, directives: List[NoqaDirective], suppressions: Suppressions) -> Iterable[Finding]:
        judged = (frozenset(STATIC_CODES) - {self.code, UnknownNoqaCode.code} | {ParseError.code}) - suppressions.undecided
        for directive in directives:
            if directive.file_level:
                continue
            unused = [c for c in directive.codes if c.code in judged and (directive.row, c.code) not in suppressions.used]
            if not unused:
                continue
            listing = ", ".join(c.text for c in unused)
            message = (
                f"Unused `# noqa` code {listing}: dplint reports no {listing} finding here."
                if len(unused) == 1
                else f"Unused `# noqa` codes {listing}: dplint reports none of these findings here."
            )
            yield self.finding(
                ctx,
                directive.row,
                (directive.column, directive.end_column),
                message,
                "Remove the unused code from the comment.",
                _removal(directive, unused),
            )


def _removal(directive: NoqaDirective, unused: Sequence[NoqaCode]) -> Optional[Fix]:
    row, line = directive.row, directive.line
    kept = [c for c in directive.codes if c not in unused]
    if kept:
        edit = Edit(", ".join(c.text for c in kept), Location(row, directive.codes[0].column), Location(row, directive.codes[-1].end_column))
        return Fix("safe", "Remove the unused code", (edit,))
    if line[directive.end_column - 1 :].strip():
        return None
    start = len(line[: directive.column - 1].rstrip()) + 1
    return Fix("safe", "Remove the unused `# noqa`", (Edit("", Location(row, start), Location(row, len(line) + 1)),))
