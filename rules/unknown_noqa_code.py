from __future__ import annotations

import re
from typing import Iterable, List

from dplint.analysis.patterns import GuardedPattern
from dplint.analysis.context import FileContext
from dplint.codes import CODES_BY_NAME
from dplint.finding import Finding
from dplint.rule import Invalid, SuppressionRule, Valid
from dplint.noqa import DPL_CODE, NoqaDirective, Suppressions

_KNOWN_CODES = frozenset(CODES_BY_NAME.values())


class UnknownNoqaCode(SuppressionRule):
    """
    ## What it does
    Reports a `# noqa: CODE` or `# dplint: noqa: CODE` comment that names a `DPL` code no dplint
    rule has, such as a typo (`DPL1O1`) or a code from a newer or older version.

    ## Why is this bad?
    A directive with an unknown code suppresses nothing: the finding it was meant to silence is
    still reported, or, worse, the author believes a line is deliberately exempt when it is not.

    ## Example
    ```python
    x.to(device)  # noqa: DPL011
    ```

    ## Use instead
    ```python
    x.to(device)  # noqa: DPL101
    ```

    ## Known problems
    Only codes that start with `DPL` are checked: other tools' codes (`E501`, `B902`) in the same
    comment are theirs to judge. Directives inside strings are not directives and are not checked.
    """

    code = "DPL002"
    name = "unknown-noqa-code"
    summary = "A `# noqa` comment names a DPL code that no dplint rule has."
    severity = "warning"
    triggers = GuardedPattern(r"noqa[ \t]*:[^\n]*DPL", ["noqa", "NOQA", "NoQA", "Noqa"], re.I, one_line=True)

    VALID = [
        Valid("import torch\nx = torch.zeros(3)\nx.to('cuda')  # noqa: DPL101\n"),
        Valid("import os  # noqa: E501, F401\n"),
        Valid("text = '# noqa: DPL999'\n"),
        Valid("# dplint: noqa: DPL101\nimport torch\n"),
    ]
    INVALID = [
        Invalid("import torch\nx = torch.zeros(3)\nx.to('cuda')  # noqa: DPL011\n", line=3),
        Invalid("import os  # noqa: E501, DPL9999\n", line=1),
        Invalid("import torch\n# dplint: noqa: DPL42\n", line=2),
    ]

    def check_directives(self, ctx: FileContext, directives: List[NoqaDirective], suppressions: Suppressions) -> Iterable[Finding]:
        for directive in directives:
            for named in directive.codes:
                if DPL_CODE.fullmatch(named.text) and named.code not in _KNOWN_CODES:
                    yield self.finding(
                        ctx,
                        directive.row,
                        (named.column, named.end_column),
                        f"`# noqa` names `{named.text}`, which is not a dplint rule code, so it suppresses nothing.",
                        f"Write the intended code (see `dplint --list-rules`) or remove `{named.text}`.",
                    )
