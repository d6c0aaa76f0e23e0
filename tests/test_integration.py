"""CI and editor integration: machine formats, fixes, the rule reference, and the pre-commit hook."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest

from dplint.docs import codes_module, explain, reference
from dplint.reporters import github_command
from dplint.rules import ALL_RULES

ROOT = Path(__file__).resolve().parent.parent
BAD = "import torch\nx = torch.zeros(3)\nx.to('cuda')\n"
GOOD = "import torch\nx = torch.zeros(3)\nx = x.to('cuda')\n"


def dplint(*args, cwd, env=None):
    environment = {k: v for k, v in os.environ.items() if not k.startswith("GITHUB_")}
    return subprocess.run(
        [sys.executable, "-m", "dplint", "--no-cache", *args], cwd=cwd, capture_output=True, text=True, env={**environment, **(env or {})}
    )


def test_github_command_escaping():
    command = github_command("error", [("file", "a,b:c%.py"), ("line", 3)], "50% done\r\nnext: a, b")
    assert command == "::error file=a%2Cb%3Ac%25.py,line=3::50% done%0D%0Anext: a, b".replace("50%", "50%25")


def test_github_format_with_awkward_path_and_message(tmp_path):
    folder = tmp_path / "we,ird:100%"
    folder.mkdir()
    (folder / "m.py").write_text("import torch\nx = torch.zeros(3)\nx.to('cuda:1,%')\n")
    result = dplint("--select", "DPL101", "--format", "github", ".", cwd=tmp_path, env={"GITHUB_WORKSPACE": str(tmp_path)})
    [line] = result.stdout.splitlines()
    assert line.startswith(
        "::error title=dplint (DPL101),file=we%2Cird%3A100%25/m.py,line=3,col=1,endLine=3,endColumn=17::"
        "we,ird:100%25/m.py:3:1: DPL101 `x.to('cuda:1,%25')` returns a moved copy"
    )
    assert result.returncode == 1


def test_github_warning_level_and_step_summary(tmp_path):
    (tmp_path / "a.py").write_text("import os\nimport torch\nos.environ['CUDA_VISIBLE_DEVICES'] = '0'\n" + BAD)
    summary = tmp_path / "summary.md"
    result = dplint("--format", "github", "a.py", cwd=tmp_path, env={"GITHUB_STEP_SUMMARY": str(summary)})
    lines = result.stdout.splitlines()
    assert lines[0].startswith("::warning title=dplint (DPL202),file=a.py,line=3,")
    assert lines[1].startswith("::error title=dplint (DPL101),file=a.py,line=6,")
    text = summary.read_text()
    assert "Found 1 error and 1 warning in 1 file." in text
    assert "### DPL101 discarded-tensor-move (1)" in text
    assert "| `a.py:6:1` |" in text


def test_sarif_validates_against_the_official_schema(tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("import os\nimport torch\nos.environ['CUDA_VISIBLE_DEVICES'] = '0'\n" + BAD)
    (tmp_path / ".git").mkdir()  # the repository root: URIs are relative to it
    result = dplint("--format", "sarif", ".", cwd=tmp_path / "src")
    document = json.loads(result.stdout)
    schema = json.loads((ROOT / "tests" / "data" / "sarif-schema-2.1.0.json").read_text())
    jsonschema.Draft4Validator(schema).validate(document)
    run = document["runs"][0]
    assert run["columnKind"] == "unicodeCodePoints"
    assert [rule["id"] for rule in run["tool"]["driver"]["rules"]] == ["DPL101", "DPL202"]
    rule = run["tool"]["driver"]["rules"][0]
    assert rule["defaultConfiguration"] == {"level": "error"} and "## Why is this bad?" in rule["help"]["markdown"]
    # The link leads to the reference installed with dplint, never to a web page that may not exist.
    assert rule["helpUri"] == (ROOT / "dplint" / "rules.md").as_uri() + "#dpl101-discarded-tensor-move"
    assert "informationUri" not in run["tool"]["driver"]
    result_101 = next(r for r in run["results"] if r["ruleId"] == "DPL101")
    location = result_101["locations"][0]["physicalLocation"]
    assert location["artifactLocation"]["uri"] == "src/a.py"
    assert location["region"] == {"startLine": 6, "startColumn": 1, "endLine": 6, "endColumn": 13}
    assert run["results"][1]["level"] == "warning" or run["results"][0]["level"] == "warning"
    # The fix: an insertion point (an empty region) before the statement, marked safe.
    (fix,) = result_101["fixes"]
    assert fix["properties"] == {"applicability": "safe"} and fix["description"]["text"].endswith("(safe fix)")
    (change,) = fix["artifactChanges"]
    assert change["artifactLocation"] == location["artifactLocation"]
    assert change["replacements"] == [
        {"deletedRegion": {"startLine": 6, "startColumn": 1, "endLine": 6, "endColumn": 1}, "insertedContent": {"text": "x = "}}
    ]
    assert all("fixes" not in r for r in run["results"] if r["ruleId"] == "DPL202")


def test_sarif_uris_are_percent_encoded_and_relative_to_srcroot(tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    folder = tmp_path / "my dir"
    folder.mkdir()
    (folder / "a,b\u00e9.py").write_text(BAD)
    (tmp_path / ".git").mkdir()
    result = dplint("--format", "sarif", ".", cwd=folder)
    document = json.loads(result.stdout)
    schema = json.loads((ROOT / "tests" / "data" / "sarif-schema-2.1.0.json").read_text())
    jsonschema.Draft4Validator(schema).validate(document)
    run = document["runs"][0]
    [artifact] = [r["locations"][0]["physicalLocation"]["artifactLocation"] for r in run["results"]]
    assert artifact == {"uri": "my%20dir/a%2Cb%C3%A9.py", "uriBaseId": "%SRCROOT%"}
    assert run["originalUriBaseIds"]["%SRCROOT%"]["uri"] == tmp_path.as_uri() + "/"
    # A file outside the root gets an absolute file URI of its own.
    outside = tmp_path.parent / f"{tmp_path.name}-outside dir"
    outside.mkdir()
    (outside / "b.py").write_text(BAD)
    document = json.loads(dplint("--format", "sarif", str(outside / "b.py"), cwd=folder).stdout)
    jsonschema.Draft4Validator(schema).validate(document)
    [result] = document["runs"][0]["results"]
    assert result["locations"][0]["physicalLocation"]["artifactLocation"] == {"uri": (outside / "b.py").as_uri()}
    assert "%20dir/b.py" in (outside / "b.py").as_uri()


def test_paths_inside_messages_are_shown_like_the_findings_own_path(tmp_path):
    """DPL301 names the file that wraps the model; each format shows that path as it shows the finding's."""
    folder = tmp_path / "my dir"
    folder.mkdir()
    (tmp_path / ".git").mkdir()
    shutil.copy(ROOT / "fixtures" / "crnn_model.py", folder / "crnn_model.py")
    shutil.copy(ROOT / "fixtures" / "crnn_train.py", folder / "train,\u00e9.py")
    workspace = {"GITHUB_WORKSPACE": str(tmp_path)}

    def message(*args, cwd=folder):
        result = subprocess.run([sys.executable, "-m", "dplint", *args], cwd=cwd, capture_output=True, text=True, env={**os.environ, **workspace})
        assert result.returncode == 1, result.stderr
        return result.stdout

    # From the project root first: the cache then holds facts whose paths are relative to it.
    assert "DataParallel gathers dim 0 (my dir/train,\u00e9.py:15)." in message(".", cwd=tmp_path)
    concise = message(".")
    assert concise.startswith("crnn_model.py:54:16: DPL301 ") and "(train,\u00e9.py:15)." in concise
    [as_json] = json.loads(message("--format", "json", "."))
    assert as_json["message"].endswith("(train,\u00e9.py:15).")
    github = message("--format", "github", ".")
    assert github.startswith("::error title=dplint (DPL301),file=my dir/crnn_model.py,") and "(my dir/train,\u00e9.py:15)." in github
    [sarif] = json.loads(message("--format", "sarif", "."))["runs"][0]["results"]
    assert sarif["message"]["text"].endswith("(my dir/train,\u00e9.py:15).")
    [gitlab] = json.loads(message("--format", "gitlab", "."))
    assert gitlab["location"]["path"] == "my dir/crnn_model.py" and gitlab["description"].endswith("(my dir/train,\u00e9.py:15).")


def test_fingerprints_survive_unrelated_edits(tmp_path):
    (tmp_path / "a.py").write_text(BAD)
    first = json.loads(dplint("--format", "sarif", "a.py", cwd=tmp_path).stdout)["runs"][0]["results"][0]
    (tmp_path / "a.py").write_text("# a comment above\n\n" + BAD)
    second = json.loads(dplint("--format", "sarif", "a.py", cwd=tmp_path).stdout)["runs"][0]["results"][0]
    assert first["partialFingerprints"] == second["partialFingerprints"]
    assert first["locations"] != second["locations"]


def test_gitlab_report_is_stable_across_runs(tmp_path):
    (tmp_path / "a.py").write_text(BAD + "x.cuda()\n")
    runs = [json.loads(dplint("--format", "gitlab", "a.py", cwd=tmp_path).stdout) for _ in range(2)]
    assert runs[0] == runs[1]
    first, second = runs[0]
    assert first["check_name"] == "DPL101" and first["severity"] == "major"
    assert first["location"] == {"path": "a.py", "lines": {"begin": 3}}
    assert first["fingerprint"] != second["fingerprint"]
    assert first["description"].startswith("DPL101 `x.to('cuda')` returns")


def test_junit_parses_as_xml(tmp_path):
    (tmp_path / "a.py").write_text(BAD)
    (tmp_path / "clean.py").write_text(GOOD)
    suites = ElementTree.fromstring(dplint("--format", "junit", ".", cwd=tmp_path).stdout.split("\n", 1)[1])
    assert suites.attrib["failures"] == "1"
    [case] = suites.iter("testcase")
    assert case.attrib["name"] == "org.dplint.DPL101" and case.attrib["line"] == "3"
    assert case.find("failure").text.startswith("line 3, col 1, `x.to('cuda')`")
    clean = ElementTree.fromstring(dplint("--format", "junit", "clean.py", cwd=tmp_path).stdout.split("\n", 1)[1])
    [passing] = clean.iter("testcase")
    assert passing.find("failure") is None


def test_json_lines_and_output_file(tmp_path):
    (tmp_path / "a.py").write_text(BAD + "x.cuda()\n")
    lines = dplint("--format", "json-lines", "a.py", cwd=tmp_path).stdout.splitlines()
    assert [json.loads(line)["location"]["row"] for line in lines] == [3, 4]
    result = dplint("--format", "sarif", "-o", "report.sarif", "a.py", cwd=tmp_path)
    assert result.stdout == "" and result.returncode == 1
    assert json.loads((tmp_path / "report.sarif").read_text())["version"] == "2.1.0"


def test_concise_marks_fixable_findings(tmp_path):
    (tmp_path / "a.py").write_text("import torch\nx = torch.zeros(3)\nx.to('cuda')\nx.detach().cpu()\n")
    lines = dplint("a.py", cwd=tmp_path).stdout.splitlines()
    assert lines[0].startswith("a.py:3:1: DPL101 [*] ") and lines[1].startswith("a.py:4:1: DPL101 `x.detach")
    assert lines[-1] == "[*] 1 fixable with the `--fix` option."


def test_diff_prints_and_writes_nothing(tmp_path):
    (tmp_path / "a.py").write_text(BAD)
    result = dplint("--diff", "a.py", cwd=tmp_path)
    assert result.returncode == 1
    assert "-x.to('cuda')\n+x = x.to('cuda')\n" in result.stdout
    assert "Would fix 1 finding." in result.stderr
    assert (tmp_path / "a.py").read_text() == BAD
    (tmp_path / "a.py").write_text(GOOD)
    assert dplint("--diff", "a.py", cwd=tmp_path).returncode == 0


def test_fix_preserves_comments_crlf_and_encoding(tmp_path):
    source = "# -*- coding: latin-1 -*-\r\nimport torch\r\nx = torch.zeros(3)  # caf\xe9\r\nx.to('cuda')  # keep me\r\n"
    (tmp_path / "a.py").write_bytes(source.encode("latin-1"))
    result = dplint("--fix", "--show-fixes", "a.py", cwd=tmp_path)
    assert result.returncode == 0
    assert "Fixed 1 finding (0 remaining)." in result.stderr and "1 × DPL101 (discarded-tensor-move)" in result.stderr
    assert (tmp_path / "a.py").read_bytes() == source.replace("x.to(", "x = x.to(").encode("latin-1")


def test_rule_reference_is_up_to_date():
    assert (ROOT / "dplint" / "rules.md").read_text() == reference(), "regenerate: python -m dplint.docs dplint/rules.md"


def test_codes_module_is_up_to_date():
    assert (ROOT / "dplint" / "codes.py").read_text() == codes_module(), "regenerate: python -m dplint.docs dplint/codes.py"


def test_reference_states_each_rules_tier():
    text = reference()
    for rule in ALL_RULES:
        assert ("Tier: preview — runs only with --preview." in explain(rule)) is rule.preview, rule.code
        [row] = [line for line in text.splitlines() if line.startswith(f"| [{rule.code}](")]
        assert row.split(" | ")[4] == ("preview" if rule.preview else "stable"), row


@pytest.mark.parametrize("rule", ALL_RULES, ids=lambda r: r.code)
def test_explain_prints_the_reference_section(rule, tmp_path):
    assert dplint("--explain", rule.code, cwd=tmp_path).stdout == explain(rule)
    assert explain(rule, level=2) in reference()


def _git_project(tmp_path, files):
    """A committed git repository holding `files`, and the environment to run git and pre-commit in."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    try:
        import pre_commit  # noqa: F401
    except ImportError:
        pytest.skip("pre-commit is not installed (it comes with the test extra)")
    repo = tmp_path / "project"
    repo.mkdir()
    for name, text in files.items():
        (repo / name).write_text(text)
    environment = {**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "cache"), "GIT_AUTHOR_NAME": "t", "GIT_COMMITTER_NAME": "t",
                   "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_EMAIL": "t@example.com"}
    for command in (["git", "init", "-q"], ["git", "add", "."], ["git", "commit", "-qm", "init"]):
        subprocess.run(command, cwd=repo, check=True, env=environment)
    return repo, environment


def test_pre_commit_hook(tmp_path):
    repo, environment = _git_project(tmp_path, {"bad.py": BAD, "good.py": GOOD})

    def try_repo(name):
        return subprocess.run(
            [sys.executable, "-m", "pre_commit", "try-repo", str(ROOT), "dplint", "--files", name],
            cwd=repo, capture_output=True, text=True, env=environment, timeout=900,
        )

    bad = try_repo("bad.py")
    if "An unexpected error has occurred" in bad.stdout + bad.stderr:
        pytest.skip(f"pre-commit could not build the hook's environment here: {(bad.stdout + bad.stderr)[-600:]}")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "bad.py:3:1: DPL101 [*] `x.to('cuda')` returns a moved copy" in bad.stdout
    good = try_repo("good.py")
    assert good.returncode == 0, good.stdout + good.stderr
    assert "Passed" in good.stdout


def _readme_code_blocks(section: str, language: str):
    text = (ROOT / "README.md").read_text()
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return [block.split("\n```", 1)[0] for block in body.split(f"```{language}\n")[1:]]


def test_readme_local_pre_commit_config_runs_the_installed_dplint(tmp_path):
    """The README's `repo: local` configuration, exactly as written, through real pre-commit (offline:
    it runs the `dplint` installed beside this Python, and builds no environment)."""
    scripts = Path(sys.executable).parent
    if shutil.which("dplint", path=str(scripts)) is None:
        pytest.skip(f"dplint is not installed in {scripts}")
    [config] = [block for block in _readme_code_blocks("Use with pre-commit", "yaml") if "repo: local" in block]
    repo, environment = _git_project(tmp_path, {"bad.py": BAD, "good.py": GOOD, ".pre-commit-config.yaml": config})
    environment["PATH"] = f"{scripts}{os.pathsep}{environment.get('PATH', '')}"

    def run_hook(name):
        return subprocess.run(
            [sys.executable, "-m", "pre_commit", "run", "--files", name], cwd=repo, capture_output=True, text=True, env=environment, timeout=300
        )

    bad = run_hook("bad.py")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "dplint" in bad.stdout and "Failed" in bad.stdout
    assert "bad.py:3:1: DPL101 [*] `x.to('cuda')` returns a moved copy" in bad.stdout
    good = run_hook("good.py")
    assert good.returncode == 0 and "Passed" in good.stdout, good.stdout + good.stderr


# The user-facing documents: the README and what it links to (the generated rule reference aside).
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_readme_install_snippets_work_from_a_clone():
    """Nothing is published on a package index: every `pip install` in the README and the other docs
    installs this checkout (or, labelled as such, what to use once dplint is published), with extras
    that exist."""
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        import tomli as tomllib
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    readme = (ROOT / "README.md").read_text()
    assert {"runtime", "server", "test"} <= set(re.findall(r"pip install (?:-e )?'\.\[([\w,]+)\]'", readme))
    for doc in DOCS:
        text = doc.read_text()
        for extra in re.findall(r"pip install (?:-e )?'\.\[([\w,]+)\]'", text):
            assert set(extra.split(",")) <= set(extras), (doc.name, extra)
        for line in text.splitlines():
            if re.search(r"pip install (?:'|\")?dplint\b(?! @ git\+)|'dplint\[", line):  # `dplint @ git+URL`: a copy of this repository
                assert "once" in line.lower() and "published" in line.lower(), (doc.name, line)


def test_readme_rule_table_lists_every_rule_with_its_tier():
    """The README's rule table: one row per rule, in the reference's order, with its code, name and tier."""
    readme = (ROOT / "README.md").read_text()
    body = readme.split("\n## Rules\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.split(" | ")[:3] for line in body.splitlines() if line.startswith("| DPL")]
    assert rows == [[f"| {rule.code}", rule.name, "preview" if rule.preview else "stable"] for rule in ALL_RULES]


def _anchors(markdown: str):
    """GitHub's anchors for a Markdown file's headings (outside code blocks)."""
    anchors, fenced = set(), False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            anchors.add(re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-"))
    return anchors


def test_docs_links_lead_somewhere():
    """Every relative link in the README and the docs names a file of this repository, and its
    `#anchor`, when it has one, a heading of that file."""
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
            if re.match(r"\w+://", target):
                continue
            path, _, anchor = target.partition("#")
            linked = (doc.parent / path).resolve() if path else doc
            assert linked.is_file(), (doc.name, target)
            if anchor and linked.suffix == ".md":
                assert anchor in _anchors(linked.read_text()), (doc.name, target)
