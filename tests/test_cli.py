"""The command line as a user meets it: run `python -m dplint` in a temporary project."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dplint import __version__

DISCARDED = "import torch\nx = torch.zeros(3)\nx.to('cuda')\n"
CLEAN = "import torch\nx = torch.zeros(3)\nx = x.to('cuda')\n"


def dplint(*args, cwd, stdin=None, env=None):
    return subprocess.run(
        [sys.executable, "-m", "dplint", *args],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )


def finding_lines(stdout: str):
    return [line for line in stdout.splitlines() if ": DPL" in line]


def write(root: Path, relative: str, text: str) -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def test_clean_file_exits_zero(tmp_path):
    write(tmp_path, "clean.py", CLEAN)
    result = dplint("clean.py", cwd=tmp_path)
    assert result.returncode == 0
    assert result.stdout.strip() == "All checks passed!"


def test_findings_exit_one_in_concise_format_when_piped(tmp_path):
    write(tmp_path, "bad.py", DISCARDED)
    result = dplint("bad.py", cwd=tmp_path)
    assert result.returncode == 1
    first, summary, fixable = result.stdout.splitlines()
    assert first.startswith("bad.py:3:1: DPL101 [*] `x.to('cuda')` returns a moved copy")
    assert summary == "Found 1 error in 1 file."
    assert fixable == "[*] 1 fixable with the `--fix` option."


def test_exit_zero(tmp_path):
    write(tmp_path, "bad.py", DISCARDED)
    assert dplint("--exit-zero", "bad.py", cwd=tmp_path).returncode == 0


def test_full_format_shows_code_frame_caret_and_help(tmp_path):
    write(tmp_path, "bad.py", DISCARDED)
    result = dplint("--format", "full", "bad.py", cwd=tmp_path)
    lines = result.stdout.splitlines()
    assert "3 | x.to('cuda')" in lines
    assert "  | ^^^^^^^^^^^^ DPL101" in lines
    assert "  = help: Assign the result: `x = x.to('cuda')`." in lines
    assert "\x1b[" not in result.stdout  # no colour when not on a terminal


def test_json_format_is_shaped_like_ruffs(tmp_path):
    write(tmp_path, "bad.py", DISCARDED)
    result = dplint("--format", "json", "bad.py", cwd=tmp_path)
    [finding] = json.loads(result.stdout)
    assert finding["code"] == "DPL101"
    assert finding["name"] == "discarded-tensor-move"
    assert finding["filename"] == str((tmp_path / "bad.py").resolve())
    assert finding["location"] == {"row": 3, "column": 1}
    assert finding["end_location"] == {"row": 3, "column": 13}
    assert finding["fix"] == {
        "applicability": "safe",
        "message": "Assign the result to `x`",
        "edits": [{"content": "x = ", "location": {"row": 3, "column": 1}, "end_location": {"row": 3, "column": 1}}],
    }
    assert finding["url"].endswith("#dpl101-discarded-tensor-move")


def test_json_is_an_empty_array_when_clean(tmp_path):
    write(tmp_path, "clean.py", CLEAN)
    assert json.loads(dplint("--format", "json", "clean.py", cwd=tmp_path).stdout) == []


def test_statistics(tmp_path):
    write(tmp_path, "a.py", DISCARDED)
    write(tmp_path, "b.py", DISCARDED + "x.cuda()\n")
    result = dplint("--statistics", ".", cwd=tmp_path)
    assert result.stdout.splitlines() == ["    3\tDPL101\tdiscarded-tensor-move"]
    as_json = json.loads(dplint("--statistics", "--format", "json", ".", cwd=tmp_path).stdout)
    assert as_json == [{"code": "DPL101", "name": "discarded-tensor-move", "count": 3}]


def test_stdin_with_filename(tmp_path):
    result = dplint("--stdin-filename", "pkg/train.py", "-", cwd=tmp_path, stdin=DISCARDED)
    assert result.returncode == 1
    assert result.stdout.startswith("pkg/train.py:3:1: DPL101 ")


def test_stdin_full_format_shows_the_stdin_source(tmp_path):
    result = dplint("--format", "full", "-", cwd=tmp_path, stdin=DISCARDED)
    assert "3 | x.to('cuda')" in result.stdout


def test_select_and_ignore_flags(tmp_path):
    write(tmp_path, "bad.py", "import torch, os\nx = torch.zeros(3)\nx.cpu()\nos.environ['CUDA_VISIBLE_DEVICES'] = '0'\n")
    codes = lambda *args: {line.split()[1] for line in finding_lines(dplint(*args, "bad.py", cwd=tmp_path).stdout)}  # noqa: E731
    assert codes() == {"DPL101", "DPL202"}
    assert codes("--select", "DPL2") == {"DPL202"}
    assert codes("--ignore", "DPL101") == {"DPL202"}
    assert codes("--select", "DPL101", "--extend-select", "DPL202") == {"DPL101", "DPL202"}


def test_unknown_rule_selector_is_a_usage_error(tmp_path):
    write(tmp_path, "bad.py", DISCARDED)
    result = dplint("--select", "DPL999", "bad.py", cwd=tmp_path)
    assert result.returncode == 2
    assert "unknown rule selector `DPL999`" in result.stderr
    assert "Traceback" not in result.stderr


def test_config_in_pyproject(tmp_path):
    write(tmp_path, "pyproject.toml", '[tool.dplint]\nignore = ["DPL101"]\n')
    write(tmp_path, "src/bad.py", DISCARDED)
    assert dplint("src", cwd=tmp_path).returncode == 0
    # A command-line flag overrides the configuration.
    assert dplint("--ignore", "DPL301", "src", cwd=tmp_path).returncode == 1


def test_per_file_ignores(tmp_path):
    write(tmp_path, "pyproject.toml", '[tool.dplint.per-file-ignores]\n"tests/*" = ["DPL101"]\n')
    write(tmp_path, "tests/test_a.py", DISCARDED)
    write(tmp_path, "src/a.py", DISCARDED)
    result = dplint(".", cwd=tmp_path)
    assert [line.split(":")[0] for line in finding_lines(result.stdout)] == ["src/a.py"]
    result = dplint("--per-file-ignores", "src/*:DPL1", ".", "--no-cache", cwd=tmp_path)
    assert result.returncode == 1 and result.stdout.startswith("tests/test_a.py")


@pytest.mark.parametrize(
    "config, message",
    [
        ('[tool.dplint]\nselectt = ["DPL101"]\n', "unknown key(s) in [tool.dplint]: selectt"),
        ('[tool.dplint]\nselect = ["XYZ1"]\n', "unknown rule selector `XYZ1`"),
        ('[tool.dplint]\nselect = 3\n', "`select` must be a list of strings"),
        ("[tool.dplint\n", "cannot read configuration"),
    ],
)
def test_bad_config_exits_two_with_a_clear_message(tmp_path, config, message):
    write(tmp_path, "pyproject.toml", config)
    write(tmp_path, "a.py", CLEAN)
    result = dplint("a.py", cwd=tmp_path)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_exclude_and_explicit_files(tmp_path):
    write(tmp_path, "pyproject.toml", '[tool.dplint]\nextend-exclude = ["generated"]\n')
    write(tmp_path, "generated/bad.py", DISCARDED)
    write(tmp_path, "build/bad.py", DISCARDED)
    write(tmp_path, ".venv/lib/bad.py", DISCARDED)
    write(tmp_path, "env/pyvenv.cfg", "home = /usr/bin\n")
    write(tmp_path, "env/lib/bad.py", DISCARDED)
    assert dplint(".", cwd=tmp_path).returncode == 0
    # A file named on the command line is linted even when excluded.
    assert dplint("generated/bad.py", cwd=tmp_path).returncode == 1


def test_noqa_comments(tmp_path):
    write(
        tmp_path,
        "a.py",
        """
        import torch
        x = torch.zeros(3)
        x.to('cuda')  # noqa: DPL101
        x.cuda()  # noqa
        x.cpu()  # noqa: DPL301
        x.to(  # noqa:DPL101,DPL202
            'cuda',
        )
        x.to(
            'cuda',
        )  # a noqa on the last line of a statement does not count: this one is reported
        """,
    )
    result = dplint("a.py", cwd=tmp_path)
    rows = [int(line.split(":")[1]) for line in finding_lines(result.stdout)]
    assert rows == [6, 10]


def test_file_level_noqa(tmp_path):
    write(tmp_path, "all.py", "# dplint: noqa\n" + DISCARDED)
    write(tmp_path, "one.py", "# dplint: noqa: DPL101\n" + DISCARDED)
    write(tmp_path, "other.py", "# dplint: noqa: DPL201\n" + DISCARDED)
    result = dplint(".", cwd=tmp_path)
    assert [line.split(":")[0] for line in finding_lines(result.stdout)] == ["other.py"]


@pytest.mark.parametrize(
    "content, reason",
    [
        (b"import torch\ndef f(:\n    x.to('cuda')\n", "syntax error"),
        (b"\x00\x01\x02 x.to(", "binary file"),
        (b"x = '\xff\xfe'\nx.to('cuda')\n", "cannot decode as utf-8 at byte 5"),
        (b"# -*- coding: klingon -*-\nx.to('cuda')\n", "cannot decode"),
        (b"x = " + b"(" * 5000 + b"1" + b")" * 5000 + b"\nx.to('cuda')\n", "too many nested parentheses"),
        (b"x = " + b"-" * 50000 + b"1\nx.to('cuda')\n", "too deeply nested to parse"),
    ],
)
def test_bad_input_is_reported_and_the_run_goes_on(tmp_path, content, reason):
    (tmp_path / "bad.py").write_bytes(content)
    write(tmp_path, "good.py", DISCARDED)
    result = dplint(".", cwd=tmp_path)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr and result.stderr == ""
    bad = [line for line in result.stdout.splitlines() if line.startswith("bad.py:")]
    assert len(bad) == 1 and " DPL000 " in bad[0] and reason in bad[0], bad
    assert any(line.startswith("good.py:3:1: DPL101") for line in result.stdout.splitlines())


def test_syntax_error_names_its_line(tmp_path):
    write(tmp_path, "bad.py", "import torch\nx.to('cuda')\ndef f(:\n    pass\n")
    [line] = finding_lines(dplint("bad.py", cwd=tmp_path).stdout)
    assert line.startswith("bad.py:3:") and "syntax error" in line


def test_missing_and_unreadable_paths(tmp_path):
    write(tmp_path, "good.py", DISCARDED)
    locked = write(tmp_path, "locked.py", DISCARDED)
    locked.chmod(0)
    try:
        result = dplint("missing.py", "locked.py", "good.py", cwd=tmp_path)
    finally:
        locked.chmod(0o644)
    lines = result.stdout.splitlines()
    assert result.returncode == 1
    assert any(line.startswith("missing.py:1:1: DPL000 cannot read: No such file or directory") for line in lines)
    if os.geteuid() != 0:  # root reads any file
        assert any(line.startswith("locked.py:1:1: DPL000 cannot read: Permission denied") for line in lines)
    assert any(line.startswith("good.py:3:1: DPL101") for line in lines)


def test_huge_file_is_reported_not_parsed(tmp_path):
    from dplint.engine import MAX_FILE_BYTES

    (tmp_path / "huge.py").write_bytes(b"x.to('cuda')\n" + b"# padding\n" * (MAX_FILE_BYTES // 10 + 1))
    result = dplint("huge.py", cwd=tmp_path)
    assert result.returncode == 1 and "file too large to lint" in result.stdout


def test_explain_and_list_rules(tmp_path):
    result = dplint("--explain", "dpl301", cwd=tmp_path)
    assert result.returncode == 0
    assert result.stdout.startswith("# DPL301: batch-dim-moved-in-forward")
    for heading in ("## What it does", "## Why is this bad?", "## Example", "## Use instead", "## Known problems"):
        assert heading in result.stdout
    assert dplint("--explain", "DPL999", cwd=tmp_path).returncode == 2
    listing = dplint("--list-rules", cwd=tmp_path).stdout.splitlines()
    codes = [line.split()[0] for line in listing]
    assert codes == sorted(codes) and len(codes) == len(set(codes))
    assert {"DPL000", "DPL101", "DPL202", "DPL301", "DPL309", "DPL310", "DPL401", "DPL501", "DPL515", "DPL601"} <= set(codes)
    states = {line.split()[0]: line.split()[3] for line in listing}
    assert states["DPL306"] == "runtime" and states["DPL304"] == "on" and states["DPL308"] == "off"
    rows = json.loads(dplint("--list-rules", "--format", "json", cwd=tmp_path).stdout)
    assert {row["code"]: row["severity"] for row in rows}["DPL202"] == "warning"


def test_version(tmp_path):
    assert dplint("--version", cwd=tmp_path).stdout.strip() == f"dplint {__version__}"


def test_bad_jobs_value(tmp_path):
    assert dplint("-j", "0", ".", cwd=tmp_path).returncode == 2
    assert dplint("-j", "many", ".", cwd=tmp_path).returncode == 2


def test_internal_error_names_file_and_rule_and_exits_two(tmp_path):
    write(tmp_path, "a.py", DISCARDED)
    write(
        tmp_path,
        "boom.py",
        """
        import runpy, sys
        from dplint.rules.discarded_tensor_move import DiscardedTensorMove

        def explode(self, ctx):
            raise ValueError("rule bug")
            yield

        DiscardedTensorMove.check = explode
        sys.argv = ["dplint", "a.py"]
        runpy.run_module("dplint", run_name="__main__")
        """,
    )
    result = subprocess.run([sys.executable, "boom.py"], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 2
    assert "internal error in rule DPL101 while linting a.py" in result.stderr
    assert "ValueError: rule bug" in result.stderr
