"""The command line as a user meets it: run `python -m dplint` in a temporary project."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import dplint as dplint_package
from dplint import __version__
from dplint.codes import RUNTIME_ONLY_CODES

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
    # The rule reference installed with dplint, at the rule's section: never a made-up web address.
    reference = Path(dplint_package.__file__).with_name("rules.md")
    assert finding["url"] == reference.as_uri() + "#dpl101-discarded-tensor-move"
    assert "\n## DPL101: discarded-tensor-move\n" in reference.read_text()


def test_json_is_an_empty_array_when_clean(tmp_path):
    write(tmp_path, "clean.py", CLEAN)
    assert json.loads(dplint("--format", "json", "clean.py", cwd=tmp_path).stdout) == []


def test_statistics(tmp_path):
    write(tmp_path, "a.py", DISCARDED)
    write(tmp_path, "b.py", DISCARDED + "x.cuda()\n")
    write(tmp_path, "c.py", "import os\nimport torch\nos.environ['CUDA_VISIBLE_DEVICES'] = '0'\n")
    result = dplint("--statistics", ".", cwd=tmp_path)
    # Ruff's marker: [*] before a rule whose findings --fix can fix, [ ] before the others.
    assert result.stdout.splitlines() == [
        "    3\tDPL101\t[*] discarded-tensor-move",
        "    1\tDPL202\t[ ] cuda-visible-devices-after-torch-import",
    ]
    as_json = json.loads(dplint("--statistics", "--format", "json", ".", cwd=tmp_path).stdout)
    assert as_json == [
        {"code": "DPL101", "name": "discarded-tensor-move", "count": 3, "fixable": 3},
        {"code": "DPL202", "name": "cuda-visible-devices-after-torch-import", "count": 1, "fixable": 0},
    ]
    (tmp_path / "a.py").unlink()
    (tmp_path / "b.py").unlink()
    assert dplint("--statistics", ".", cwd=tmp_path).stdout == "    1\tDPL202\tcuda-visible-devices-after-torch-import\n"


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
    # The selector is echoed as typed.
    assert "unknown rule selector `dpl9x`" in dplint("--ignore", "dpl9x", "bad.py", cwd=tmp_path).stderr
    assert "unknown rule selector `discarded-move`" in dplint("--select", "discarded-move", "bad.py", cwd=tmp_path).stderr


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
        ('[tool.dplint]\nselect = 3\n', "`select` must be a list of strings, not an integer."),
        ("[tool.dplint\n", "cannot read configuration"),
        # A string is not a list, as in Ruff: it would be taken for a comma-separated selection.
        ('[tool.dplint]\nselect = "DPL2"\n', '`select` must be a list of strings, not a string: select = ["DPL2"].'),
        ('[tool.dplint]\nignore = "DPL101, DPL2"\n', '`ignore` must be a list of strings, not a string: ignore = ["DPL101", "DPL2"].'),
        ('[tool.dplint]\nextend-select = "DPL1"\n', "`extend-select` must be a list of strings, not a string"),
        ('[tool.dplint]\nexclude = "build"\n', '`exclude` must be a list of strings, not a string: exclude = ["build"].'),
        ('[tool.dplint]\nextend-exclude = ["gen", 5]\n', "`extend-exclude` must be a list of strings, not a list holding an integer."),
        ('[tool.dplint.per-file-ignores]\n"tests/*" = "DPL101"\n', 'per-file-ignores `tests/*` must be a list of strings, not a string: "tests/*" = ["DPL101"].'),
        ('[tool.dplint]\npreview = "true"\n', "`preview` must be true or false, not a string."),
        ('[tool.dplint]\npreview = 1\n', "`preview` must be true or false, not an integer."),
    ],
)
def test_bad_config_exits_two_with_a_clear_message(tmp_path, config, message):
    write(tmp_path, "pyproject.toml", config)
    write(tmp_path, "a.py", CLEAN)
    result = dplint("a.py", cwd=tmp_path)
    assert result.returncode == 2
    [line] = result.stderr.splitlines()  # one line, no traceback
    assert message in line


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


def test_a_project_templates_placeholder_files_are_not_linted(tmp_path):
    # cookiecutter fills `{{cookiecutter.name}}` in names and text at generation: not Python until then.
    write(tmp_path, "templates/{{cookiecutter.name}}/model_{{cookiecutter.name}}.py", "class {{cookiecutter.cls}}:\n    pass\n")
    write(tmp_path, "templates/model_{{cookiecutter.name}}.py", "{% if cookiecutter.tf %}\nimport tensorflow\n{% endif %}\n")
    write(tmp_path, "train.py", DISCARDED)
    result = dplint(".", cwd=tmp_path)
    assert [line.split(":")[0] for line in result.stdout.splitlines() if ": DPL" in line] == ["train.py"]


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


def test_a_file_that_does_not_parse_never_passes_though_no_rule_looks_at_it(tmp_path):
    # None of the rules' trigger words: no rule would check it, so no DPL000; the summary names it instead.
    write(tmp_path, "bad.py", "import os\ndef f(:\n    pass\n")
    for run in ("cold", "from the cache"):
        result = dplint(".", cwd=tmp_path)
        assert (result.returncode, result.stdout) == (0, "No findings; 1 file does not parse and was not checked: bad.py.\n"), run
    write(tmp_path, "good.py", DISCARDED)
    for name in ("more.py", "other.py", "last.py"):
        write(tmp_path, f"sub/{name}", "print 'python 2'\n")
    result = dplint(".", cwd=tmp_path)
    assert result.returncode == 1 and "good.py:3:1: DPL101" in result.stdout
    assert "Found 1 error in 1 file; 4 files do not parse and were not checked: bad.py, sub/last.py, sub/more.py and 1 more.\n" in result.stdout


def test_a_file_some_rule_would_check_that_does_not_parse_is_dpl000(tmp_path):
    write(tmp_path, "bad.py", "import torch\nmodel = torch.nn.DataParallel(net\n")
    [line] = finding_lines(dplint(".", cwd=tmp_path).stdout)
    assert line.startswith("bad.py:2:") and " DPL000 " in line


def test_standard_input_that_does_not_parse_is_dpl000_whatever_it_holds(tmp_path):
    result = dplint("-", cwd=tmp_path, stdin="import os\ndef f(:\n    pass\n")
    assert result.returncode == 1 and result.stdout.startswith("<stdin>:2:7: DPL000 syntax error: invalid syntax.")


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
    assert "\nFix: none.\n" in result.stdout
    assert "\nFix: safe: `--fix` applies it.\n" in dplint("--explain", "DPL101", cwd=tmp_path).stdout
    assert dplint("--explain", "DPL999", cwd=tmp_path).returncode == 2
    header, *listing = dplint("--list-rules", cwd=tmp_path).stdout.splitlines()
    assert header.split() == ["CODE", "NAME", "DEFAULT", "TIER", "FIX", "CHECKED", "SEVERITY", "SUMMARY"]
    codes = [line.split()[0] for line in listing]
    assert codes == sorted(codes) and len(codes) == len(set(codes))
    assert {"DPL000", "DPL101", "DPL202", "DPL301", "DPL309", "DPL310", "DPL401", "DPL501", "DPL515", "DPL601"} <= set(codes)
    columns = {line.split()[0]: line.split()[1:7] for line in listing}
    assert columns["DPL101"] == ["discarded-tensor-move", "on", "stable", "safe", "static", "error"]
    assert columns["DPL306"] == ["uneven-batch", "on", "stable", "none", "runtime", "warning"]
    assert columns["DPL514"][1:3] == ["on", "preview"]
    assert columns["DPL308"][1:5] == ["off", "stable", "none", "static"] and columns["DPL001"][1:4] == ["off", "stable", "safe"]
    assert columns["DPL102"][3] == "safe/unsafe"
    rows = json.loads(dplint("--list-rules", "--format", "json", cwd=tmp_path).stdout)
    by_code = {row["code"]: row for row in rows}
    assert [row["code"] for row in rows] == codes
    assert by_code["DPL202"]["severity"] == "warning"
    assert by_code["DPL101"]["fix"] == ["safe"] and by_code["DPL301"]["fix"] == []
    assert by_code["DPL102"]["fix"] == ["safe", "unsafe"]
    assert by_code["DPL306"]["checked"] == "runtime" and by_code["DPL301"]["checked"] == "static"
    assert by_code["DPL308"]["enabled_by_default"] is False and by_code["DPL304"]["enabled_by_default"] is True
    assert by_code["DPL304"]["preview"] is True and by_code["DPL101"]["preview"] is False


@pytest.mark.parametrize("code", sorted(RUNTIME_ONLY_CODES))
def test_explain_says_what_a_runtime_only_rule_was_checked_on(tmp_path, code):
    # The wild sweep measures the static rules only: a runtime rule's docs say what it was run on instead.
    explained = dplint("--explain", code, cwd=tmp_path).stdout
    [line] = [line for line in explained.splitlines() if line.startswith("Checked on: ")]
    assert len(line) > len("Checked on: ") + 40 and "Precision in the wild" not in explained


def test_explain_accepts_the_rule_name(tmp_path):
    by_name = dplint("--explain", "batch-dim-moved-in-forward", cwd=tmp_path)
    assert by_name.returncode == 0 and by_name.stdout == dplint("--explain", "DPL301", cwd=tmp_path).stdout
    unknown = dplint("--explain", "batch-dim-moved", cwd=tmp_path)
    assert unknown.returncode == 2 and "no rule has the code or name `batch-dim-moved`" in unknown.stderr


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


WARNING_ONLY = "import os\nimport torch\nos.environ['CUDA_VISIBLE_DEVICES'] = '0'\n"  # DPL202 is a warning


@pytest.mark.parametrize("layout", [{}, {"notes.txt": "x.to('cuda')\n", "sub/README.md": "# docs\n"}])
def test_no_python_files_found(tmp_path, layout):
    for relative, text in layout.items():
        write(tmp_path, relative, text)
    result = dplint(".", cwd=tmp_path)
    assert result.returncode == 0
    assert result.stderr == "No Python files found under the given path(s)\n"
    assert result.stdout == ""  # not "All checks passed!": nothing was checked
    assert dplint("-s", ".", cwd=tmp_path).stderr == ""
    # A folder holding Python files does not say so, even when every file is clean.
    write(tmp_path, "clean.py", CLEAN)
    assert dplint(".", cwd=tmp_path).stderr == ""


def test_stdin_filename_reads_standard_input_without_a_dash(tmp_path):
    result = dplint("--stdin-filename", "pkg/train.py", cwd=tmp_path, stdin=DISCARDED)
    assert result.returncode == 1
    assert result.stdout.startswith("pkg/train.py:3:1: DPL101 ")
    mixed = dplint("--stdin-filename", "a.py", "other.py", cwd=tmp_path, stdin=DISCARDED)
    assert mixed.returncode == 2 and "--stdin-filename reads standard input" in mixed.stderr


def test_fix_on_stdin_prints_the_fixed_source_and_writes_no_file(tmp_path):
    on_disk = write(tmp_path, "train.py", "# the saved version\n")
    source = DISCARDED + "y = torch.ones(2)\ny.cuda()\nmodel = torch.nn.DataParallel(model)\nmodel.module.fc  # noqa: DPL999\n"
    result = dplint("--fix", "--stdin-filename", "train.py", cwd=tmp_path, stdin=source)
    assert result.stdout == source.replace("x.to(", "x = x.to(").replace("y.cuda()", "y = y.cuda()")
    # What remains is reported on stderr, and decides the exit status.
    assert finding_lines(result.stderr) == [
        "train.py:7:26: DPL002 `# noqa` names `DPL999`, which is not a dplint rule code, so it suppresses nothing."
    ]
    assert result.returncode == 1
    assert on_disk.read_text() == "# the saved version\n"
    clean = dplint("--fix", "-", cwd=tmp_path, stdin=CLEAN)
    assert (clean.returncode, clean.stdout) == (0, CLEAN)
    # Input that is not source text: nothing on stdout for an editor to take as the buffer.
    binary = subprocess.run([sys.executable, "-m", "dplint", "--fix", "-"], cwd=tmp_path, input=b"\0x.to(", capture_output=True)
    assert (binary.returncode, binary.stdout) == (1, b"") and b"DPL000" in binary.stderr


def test_diff_on_stdin_prints_the_diff_and_writes_no_file(tmp_path):
    on_disk = write(tmp_path, "train.py", "# the saved version\n")
    result = dplint("--diff", "--stdin-filename", "train.py", cwd=tmp_path, stdin=DISCARDED)
    assert result.returncode == 1
    assert result.stdout.startswith("--- a/train.py\n+++ b/train.py\n")
    assert "-x.to('cuda')\n+x = x.to('cuda')\n" in result.stdout
    assert "Would fix 1 finding." in result.stderr
    assert on_disk.read_text() == "# the saved version\n"
    clean = dplint("--diff", "-", cwd=tmp_path, stdin=CLEAN)
    assert (clean.returncode, clean.stdout) == (0, "")


@pytest.mark.parametrize(
    "flags, env, coloured",
    [
        (["--color", "always"], {}, True),
        (["--color", "always"], {"NO_COLOR": "1"}, True),
        (["--color", "never"], {"FORCE_COLOR": "1"}, False),
        ([], {}, False),  # auto, and stdout is a pipe
        ([], {"FORCE_COLOR": "1"}, True),
        (["--color", "auto"], {"FORCE_COLOR": "1", "NO_COLOR": "1"}, False),
    ],
)
def test_color_option_and_environment(tmp_path, flags, env, coloured):
    write(tmp_path, "bad.py", DISCARDED)
    environment = {"NO_COLOR": "", "FORCE_COLOR": "", "TERM": "dumb", **env}
    result = dplint("--format", "full", *flags, "bad.py", cwd=tmp_path, env=environment)
    assert result.returncode == 1
    assert ("\x1b[" in result.stdout) is coloured
    assert "x.to('cuda')" in result.stdout
    assert dplint("--color", "sometimes", "bad.py", cwd=tmp_path).returncode == 2


def test_quiet_drops_the_summary_and_silent_prints_nothing(tmp_path):
    write(tmp_path, "bad.py", DISCARDED)
    quiet = dplint("-q", "bad.py", cwd=tmp_path)
    assert quiet.returncode == 1 and quiet.stdout == "bad.py:3:1: DPL101 [*] " + quiet.stdout.split(" [*] ")[1]
    assert len(quiet.stdout.splitlines()) == 1
    full = dplint("--quiet", "--format", "full", "bad.py", cwd=tmp_path).stdout
    assert "3 | x.to('cuda')" in full and "Found" not in full and "fixable" not in full
    silent = dplint("-s", "bad.py", cwd=tmp_path)
    assert (silent.returncode, silent.stdout, silent.stderr) == (1, "", "")
    fixed = dplint("--silent", "--fix", "bad.py", cwd=tmp_path)
    assert (fixed.returncode, fixed.stdout, fixed.stderr) == (0, "", "")
    assert (tmp_path / "bad.py").read_text() == CLEAN
    # Errors in dplint's use are still said.
    assert "unknown" in dplint("-s", "--select", "DPL999", "bad.py", cwd=tmp_path).stderr


def test_exit_zero_on_warnings(tmp_path):
    write(tmp_path, "warn.py", WARNING_ONLY)
    result = dplint("--exit-zero-on-warnings", "warn.py", cwd=tmp_path)
    assert result.returncode == 0
    assert [line.split()[1] for line in finding_lines(result.stdout)] == ["DPL202"]
    assert dplint("warn.py", cwd=tmp_path).returncode == 1
    write(tmp_path, "error.py", DISCARDED)
    assert dplint("--exit-zero-on-warnings", ".", cwd=tmp_path).returncode == 1


def test_progress_bar_only_on_a_terminal_and_never_quiet(tmp_path, monkeypatch):
    from dplint import cli

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    for index in range(3):
        write(tmp_path, f"m{index}.py", DISCARDED)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli, "PROGRESS_DELAY_S", 0.0)

    def run(*flags, stderr_is_terminal=True):
        monkeypatch.setattr(sys, "stdout", io.StringIO())
        monkeypatch.setattr(sys, "stderr", Terminal() if stderr_is_terminal else io.StringIO())
        status = cli.main(["--no-cache", "-j", "1", *flags, "."])
        return status, sys.stdout.getvalue(), sys.stderr.getvalue()

    status, stdout, stderr = run()
    # Both passes show: reading the project's facts, then checking the named files.
    assert status == 1 and "3/3" in stderr and "Reading project" in stderr and "Checking" in stderr
    assert "Checking" not in stdout and stdout.endswith("Found 3 errors in 3 files.\n[*] 3 fixable with the `--fix` option.\n")
    for flags in (["-q"], ["-s"], ["--format", "json"], ["--format", "sarif"]):
        assert run(*flags)[2] == "", flags
    assert run(stderr_is_terminal=False)[2] == ""
    # Below the delay, nothing appears: a quick run does not flicker.
    monkeypatch.setattr(cli, "PROGRESS_DELAY_S", 60.0)
    assert run()[2] == ""


def test_unknown_noqa_code_is_a_warning_naming_the_code(tmp_path):
    write(
        tmp_path,
        "a.py",
        """
        import torch
        x = torch.zeros(3)
        x.to('cuda')  # noqa: DPL1O1
        y = 1  # noqa: E501, DPL777
        z = 2  # noqa: E501, DPL101
        note = "# noqa: DPL888"
        """,
    )
    result = dplint("a.py", cwd=tmp_path)
    assert finding_lines(result.stdout) == [
        "a.py:4:1: DPL101 [*] " + finding_lines(result.stdout)[0].split(" [*] ")[1],
        "a.py:4:23: DPL002 `# noqa` names `DPL1`, which is not a dplint rule code, so it suppresses nothing.",
        "a.py:5:22: DPL002 `# noqa` names `DPL777`, which is not a dplint rule code, so it suppresses nothing.",
    ]
    assert "Found 1 error and 2 warnings in 1 file." in result.stdout
    assert dplint("--exit-zero-on-warnings", "--ignore", "DPL101", "a.py", cwd=tmp_path).returncode == 0


NOQA_SOURCE = """\
import torch
x = torch.zeros(3)
x.to('cuda')  # noqa: DPL101
x = x.cuda()  # noqa: DPL101
x.cpu()  # noqa: E501, DPL101, DPL202
y = x.to('cuda')  # noqa: E501,DPL301
z = x.to('cuda')  # noqa: DPL101 - moved on purpose
w = x.to('cuda')  # noqa
out = model(x)  # noqa: DPL306
"""


def test_unused_noqa_is_off_by_default_and_its_fix_keeps_other_codes(tmp_path):
    write(tmp_path, "a.py", NOQA_SOURCE)
    assert dplint("a.py", cwd=tmp_path).returncode == 0
    result = dplint("--extend-select", "DPL001", "a.py", cwd=tmp_path)
    reported = [(line.split(": DPL001")[0], " DPL001 [*] " in line) for line in finding_lines(result.stdout)]
    # Line 7 has text after the codes: it is reported, but no fix is offered.
    assert reported == [("a.py:4:15", True), ("a.py:5:10", True), ("a.py:6:19", True), ("a.py:7:19", False)]
    assert "Unused `# noqa` code DPL202: dplint reports no DPL202 finding here." in result.stdout
    fixed = dplint("--extend-select", "DPL001", "--fix", "a.py", cwd=tmp_path)
    # DPL001 is a warning: the fixes are counted as findings, not errors.
    assert fixed.returncode == 1 and "Fixed 3 findings (1 remaining)." in fixed.stderr
    assert (tmp_path / "a.py").read_text().splitlines()[2:6] == [
        "x.to('cuda')  # noqa: DPL101",
        "x = x.cuda()",
        "x.cpu()  # noqa: E501, DPL101",
        "y = x.to('cuda')  # noqa: E501",
    ]


def test_unused_noqa_does_not_depend_on_the_selection(tmp_path):
    # DPL101 is not selected, yet its directive on line 3 suppresses a finding: it is not unused.
    write(tmp_path, "a.py", NOQA_SOURCE)
    result = dplint("--select", "DPL001", "a.py", cwd=tmp_path)
    assert [line.split(":")[1] for line in finding_lines(result.stdout)] == ["4", "5", "6", "7"]
    # A file that no selected rule's prefilter matches is still judged.
    write(tmp_path, "b.py", "import os  # noqa: DPL201\n")
    assert [line.split(" ")[1] for line in finding_lines(dplint("--select", "DPL001", "b.py", cwd=tmp_path).stdout)] == ["DPL001"]
    # Silenced like any finding: by its own code on the line, or for the whole file.
    write(tmp_path, "c.py", "import os  # noqa: DPL201, DPL001\n# dplint: noqa: DPL001\n")
    assert dplint("--select", "DPL001", "c.py", cwd=tmp_path).returncode == 0


def test_internal_error_with_fix_on_stdin_prints_the_source_unchanged(tmp_path):
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
        sys.argv = ["dplint", "--fix", "--stdin-filename", "a.py"]
        runpy.run_module("dplint", run_name="__main__")
        """,
    )
    result = subprocess.run([sys.executable, "boom.py"], cwd=tmp_path, input=DISCARDED, capture_output=True, text=True)
    assert (result.returncode, result.stdout) == (2, DISCARDED)
    assert "internal error in rule DPL101 while linting a.py" in result.stderr


# ----- the preview tier ------------------------------------------------------------------------------

# DPL514 is a preview rule: its precision on real repositories is not yet measured at 0.95.
NESTED_WRAPPERS = "import torch\nmodel = torch.nn.parallel.DistributedDataParallel(torch.nn.DataParallel(net).cuda())\n"
PREVIEW_WARNING = "dplint: warning: DPL514 is a preview rule; it runs only with --preview (or preview = true in [tool.dplint]).\n"


def test_preview_rule_runs_only_with_preview(tmp_path):
    write(tmp_path, "wrap.py", NESTED_WRAPPERS)
    default = dplint("wrap.py", cwd=tmp_path)
    assert (default.returncode, default.stdout, default.stderr) == (0, "All checks passed!\n", "")
    preview = dplint("--preview", "wrap.py", cwd=tmp_path)
    assert preview.returncode == 1 and [line.split()[1] for line in finding_lines(preview.stdout)] == ["DPL514"]
    write(tmp_path, "pyproject.toml", "[tool.dplint]\npreview = true\n")
    assert [line.split()[1] for line in finding_lines(dplint("wrap.py", cwd=tmp_path).stdout)] == ["DPL514"]
    write(tmp_path, "pyproject.toml", '[tool.dplint]\npreview = "yes"\n')
    bad = dplint("wrap.py", cwd=tmp_path)
    pyproject = (tmp_path / "pyproject.toml").resolve()
    assert bad.returncode == 2 and bad.stderr == f"dplint: error: {pyproject}: `preview` must be true or false, not a string.\n"


def test_selecting_a_preview_rule_without_preview_warns_once_and_does_not_run_it(tmp_path):
    write(tmp_path, "wrap.py", NESTED_WRAPPERS)
    # By code and by name, in two options: one warning.
    result = dplint("--select", "DPL514", "--extend-select", "data-parallel-inside-ddp", "wrap.py", cwd=tmp_path)
    assert (result.returncode, result.stderr) == (0, PREVIEW_WARNING)
    assert finding_lines(result.stdout) == []
    write(tmp_path, "pyproject.toml", '[tool.dplint]\nextend-select = ["DPL514"]\n')
    assert dplint("wrap.py", cwd=tmp_path).stderr == PREVIEW_WARNING
    (tmp_path / "pyproject.toml").unlink()
    # Ignoring one says nothing; with --preview, selecting one runs it without a word.
    assert dplint("--ignore", "DPL514", "wrap.py", cwd=tmp_path).stderr == ""
    selected = dplint("--preview", "--select", "DPL514", "wrap.py", cwd=tmp_path)
    assert selected.stderr == "" and [line.split()[1] for line in finding_lines(selected.stdout)] == ["DPL514"]


def test_prefixes_and_all_pick_preview_rules_only_with_preview(tmp_path):
    write(tmp_path, "wrap.py", NESTED_WRAPPERS)
    for selector in ("DPL5", "ALL"):
        quiet = dplint("--select", selector, "wrap.py", cwd=tmp_path)
        assert (quiet.returncode, quiet.stderr) == (0, ""), selector
        found = dplint("--preview", "--select", selector, "wrap.py", cwd=tmp_path)
        assert [line.split()[1] for line in finding_lines(found.stdout)] == ["DPL514"], selector


def test_show_settings_names_the_file_and_the_resolved_selection(tmp_path):
    write(tmp_path, "pyproject.toml", '[tool.dplint]\nselect = ["DPL1"]\nignore = ["invalid-device-string"]\npreview = true\n')
    result = dplint("--show-settings", "--extend-select", "DPL514", ".", cwd=tmp_path)
    assert result.returncode == 0 and result.stderr == ""
    lines = result.stdout.splitlines()
    assert lines[0] == f"configuration file: {tmp_path.resolve() / 'pyproject.toml'}"
    assert "enabled (4): DPL101, DPL103, DPL104, DPL514" in lines and "preview: true" in lines
    (tmp_path / "pyproject.toml").unlink()
    assert dplint("--show-settings", cwd=tmp_path).stdout.startswith("configuration file: none found (dplint's defaults)\n")


def test_show_files_lists_what_a_run_would_check(tmp_path):
    write(tmp_path, "pyproject.toml", '[tool.dplint]\nextend-exclude = ["generated"]\n')
    write(tmp_path, "src/b.py", CLEAN)
    write(tmp_path, "src/a.py", CLEAN)
    write(tmp_path, "generated/c.py", CLEAN)
    write(tmp_path, "notes.txt", "")
    result = dplint("--show-files", ".", cwd=tmp_path)
    assert (result.returncode, result.stdout, result.stderr) == (0, "src/a.py\nsrc/b.py\n", "")
    missing = dplint("--show-files", "src", "nowhere.py", cwd=tmp_path)
    assert missing.returncode == 0 and missing.stderr == "dplint: warning: nowhere.py: No such file or directory\n"


# ----- rule names, per-file-ignores, paths -----------------------------------------------------------


def test_rule_names_are_accepted_wherever_codes_are(tmp_path):
    write(tmp_path, "bad.py", "import torch, os\nx = torch.zeros(3)\nx.cpu()\nos.environ['CUDA_VISIBLE_DEVICES'] = '0'\n")
    codes = lambda *args: {line.split()[1] for line in finding_lines(dplint(*args, "bad.py", cwd=tmp_path).stdout)}  # noqa: E731
    assert codes("--select", "discarded-tensor-move") == {"DPL101"}
    assert codes("--ignore", "Discarded-Tensor-Move") == {"DPL202"}
    assert codes("--select", "DPL101", "--extend-select", "cuda-visible-devices-after-torch-import") == {"DPL101", "DPL202"}
    assert codes("--per-file-ignores", "bad.py:discarded-tensor-move") == {"DPL202"}
    write(tmp_path, "pyproject.toml", '[tool.dplint]\nignore = ["cuda-visible-devices-after-torch-import"]\n')
    assert codes() == {"DPL101"}


def test_per_file_ignores_patterns_on_the_command_line_are_relative_to_here_or_the_project(tmp_path):
    write(tmp_path, "pyproject.toml", "[tool.dplint]\n")
    write(tmp_path, "src/sub/a.py", DISCARDED)
    here = tmp_path / "src"
    for pattern in ("sub/*", "src/sub/*"):  # from the current folder, and from the pyproject.toml's
        result = dplint("--per-file-ignores", f"{pattern}:DPL101", ".", cwd=here)
        assert (result.returncode, result.stderr) == (0, ""), pattern
    typo = dplint("--per-file-ignores", "sbu/*:DPL101", ".", cwd=here)
    assert typo.returncode == 1
    assert typo.stderr == "dplint: warning: per-file-ignores pattern `sbu/*` matches no file checked.\n"


def test_per_file_ignores_in_the_configuration_warn_only_when_they_match_nothing_in_the_project(tmp_path):
    write(tmp_path, "pyproject.toml", '[tool.dplint.per-file-ignores]\n"tests/*" = ["DPL101"]\n"tset/*" = ["DPL101"]\n')
    write(tmp_path, "tests/test_a.py", DISCARDED)
    write(tmp_path, "src/a.py", DISCARDED)
    # One staged file: `tests/*` matches files of the project, only the typo is reported.
    result = dplint("src/a.py", cwd=tmp_path)
    assert result.stderr == "dplint: warning: per-file-ignores pattern `tset/*` matches no file checked.\n"
    # The configuration's patterns are relative to the pyproject.toml's folder, wherever dplint runs.
    inside = dplint(".", cwd=tmp_path / "tests")
    assert inside.returncode == 0 and "`tests/*`" not in inside.stderr


def test_paths_outside_the_current_folder_are_shown_as_given(tmp_path):
    write(tmp_path, "project/bad.py", DISCARDED)
    (tmp_path / "here").mkdir()
    absolute = tmp_path / "project" / "bad.py"
    assert dplint(str(absolute), cwd=tmp_path / "here").stdout.startswith(f"{absolute}:3:1: DPL101 ")
    assert dplint("../project/bad.py", cwd=tmp_path / "here").stdout.startswith("../project/bad.py:3:1: DPL101 ")
    missing = dplint("/nonexistent/path.py", cwd=tmp_path / "here")
    assert missing.returncode == 1
    assert finding_lines(missing.stdout) == [
        "/nonexistent/path.py:1:1: DPL000 cannot read: No such file or directory. The file was not checked."
    ]


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="Python 3.12 parses this syntax")
@pytest.mark.parametrize(
    "source, construct",
    [
        ('import torch\nx = {"a": 1}\ny = f"{x["a"]}"\n', "an f-string with quotes, backslashes, comments or line breaks inside its braces (PEP 701)"),
        (
            'import torch\nprint(\n    f"Saving {\n        "guided" if torch.cuda.is_available() else "plain"}"\n)\n',
            "an f-string with quotes, backslashes, comments or line breaks inside its braces (PEP 701)",
        ),
        ("import torch\ntype Device = str | torch.device\n", "a `type` statement (PEP 695)"),
        ("import torch\ndef first[T](items: list[T]) -> T:\n    return items[0].to('cuda')\n", "a type parameter list (PEP 695)"),
    ],
)
def test_newer_python_syntax_says_which_python_it_needs(tmp_path, source, construct):
    write(tmp_path, "new.py", source + "x.to('cuda')\n")
    [line] = finding_lines(dplint("new.py", cwd=tmp_path).stdout)
    running = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert f"DPL000 syntax error: {construct} needs Python 3.12 or newer; dplint runs on Python {running}." in line


def test_a_plain_syntax_error_makes_no_claim_about_python_versions(tmp_path):
    write(tmp_path, "bad.py", 'import torch\ny = f"{}"\nx.to("cuda")\n')
    [line] = finding_lines(dplint("bad.py", cwd=tmp_path).stdout)
    assert "DPL000 syntax error: f-string" in line and "Python 3.12" not in line
