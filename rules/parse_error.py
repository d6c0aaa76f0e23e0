from __future__ import annotations

from dplint.rule import Invalid, Rule, Valid


class ParseError(Rule):
    """
    ## What it does
    Reports a file dplint could not analyse: a syntax error (with its line), bytes that are not valid
    in the file's encoding, a binary file, a file too large or too deeply nested to parse, or a path
    that cannot be read. The run goes on with the other files and exits with status 1.

    dplint parses with the Python it runs on. Where that Python is older than the file's syntax (an
    f-string nesting the same quotes, a `type` statement or a type parameter list, all Python 3.12),
    the message says which construct needs which Python.

    ## Why is this bad?
    A file that cannot be parsed cannot be checked: any pitfall in it goes unreported.

    ## Example
    ```python
    def train(model, loader:
        ...
    ```

    ## Use instead
    Fix the syntax error, re-save the file as UTF-8, or exclude the file (`extend-exclude` in
    `[tool.dplint]`) when it is not Python source. For newer syntax, run dplint on the Python the
    project uses.

    ## Known problems
    Every file checked is parsed by CPython, also one that mentions none of the rules' trigger words
    (only libcst's slower parse is skipped there), so a syntax error is reported wherever it is. dplint
    is not a general linter: use Ruff or pyflakes for the rest. This code cannot be selected or ignored.
    """

    code = "DPL000"
    name = "parse-error"
    summary = "The file could not be read or parsed, so it was not checked."

    VALID = [
        Valid("x = torch.zeros(3)\nx = x.to('cuda')\n"),
        Valid("import os\nos.environ['CUDA_VISIBLE_DEVICES'] = '0'\n"),
        Valid("match point:\n    case (x, y):\n        x.to(y)\n"),
    ]
    INVALID = [
        Invalid("def train(model, loader:\n    data.to(device)\n", line=1),
        Invalid("x.to(device\n", line=1),
        Invalid("import os\nos.environ['CUDA_VISIBLE_DEVICES'] = (\n", line=2),
    ]
