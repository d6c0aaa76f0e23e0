"""Robustness proven by fuzzing: no input makes dplint crash, hang, or change its mind over a rewrap.

Three generators, all reproducible (`derandomize=True`):
- `programs()`: a valid program from hypothesmith with the rules' trigger snippets (every rule's
  INVALID examples, so a new rule is covered by adding it) spliced in at random places and depths,
  inside the constructs where analyses go wrong (one-line suites, `match`, `try/except*`, async
  forms, lambdas, comprehensions, decorators, recursive functions, dead code, semicolons...);
- `mutants()`: syntax-preserving rewrites of the fixtures;
- pathological files (huge lines, deep nesting, many classes, odd line endings and encodings).
`bench/fuzz.py` runs `programs()` for thousands of examples; this file keeps CI's share small.
"""

from __future__ import annotations

import ast
import random
import sys
import textwrap
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import hypothesmith
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dplint.api import default_settings, lint_paths, lint_text
from dplint.engine import FileResult, SourceFile
from dplint.rules import ALL_RULES, CHECKS

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
EVERY_RULE = default_settings([rule.code for rule in CHECKS])  # `--select ALL`
SLOWEST_GENERATED_FILE_SECONDS = 2.0
SLOWEST_PATHOLOGICAL_FILE_SECONDS = 5.0
FUZZ = dict(deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))


def parses(text: str) -> bool:
    try:
        ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


# Every rule's trigger snippets. DPL000's examples are syntax errors, which a generator of valid programs skips.
TRIGGERS: List[str] = [example.source for rule in ALL_RULES for example in rule.INVALID if parses(example.source)]


# ----- program text surgery, shared by the generator and the mutations ------------------------------


def indented(block: str, prefix: str = "    ") -> str:
    return "".join(prefix + line if line.strip() else line for line in block.splitlines(keepends=True))


def with_newline(text: str) -> str:
    return text if text.endswith("\n") else text + "\n"


def _segment(line: str, start: int, end: Optional[int] = None) -> str:
    """A slice of a line by the byte columns `ast` gives."""
    data = line.encode("utf-8")
    return data[start:end].decode("utf-8")


def _indentation(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t\f"))]


def statement_lists(tree: ast.AST) -> List[List[ast.stmt]]:
    """Every list of sibling statements: module, function and class bodies, branches, handlers, cases."""
    lists: List[List[ast.stmt]] = []
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            value = getattr(node, field, None)
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                lists.append(value)
    return lists


def _first_line(statement: ast.stmt) -> int:
    decorators = getattr(statement, "decorator_list", [])
    return min([statement.lineno, *(d.lineno for d in decorators)])


def owns_its_lines(lines: Sequence[str], siblings: Sequence[ast.stmt], index: int) -> bool:
    """The statement starts its first line (after indentation) and no sibling shares its lines."""
    statement = siblings[index]
    first = lines[_first_line(statement) - 1]
    if len(_indentation(first).encode("utf-8")) != statement.col_offset:
        return False
    if index > 0 and siblings[index - 1].end_lineno >= _first_line(statement):
        return False
    return index + 1 == len(siblings) or siblings[index + 1].lineno > statement.end_lineno


def is_simple(statement: ast.stmt) -> bool:
    return not hasattr(statement, "body") and not isinstance(statement, getattr(ast, "Match", ()))


def line_ranges(text: str) -> List[Tuple[int, int, str]]:
    """(first, last, indentation) of runs of whole sibling statements, 0-based line indices, inclusive."""
    lines = text.splitlines()
    ranges = []
    for siblings in statement_lists(ast.parse(text)):
        whole = [owns_its_lines(lines, siblings, i) for i in range(len(siblings))]
        for i in range(len(siblings)):
            for j in range(i, min(i + 3, len(siblings))):
                if not whole[j]:
                    break
                ranges.append((_first_line(siblings[i]) - 1, siblings[j].end_lineno - 1, _indentation(lines[_first_line(siblings[i]) - 1])))
    return ranges


def replace_lines(text: str, first: int, last: int, block: str) -> str:
    lines = text.splitlines(keepends=True)
    return "".join(lines[:first]) + with_newline(block) + "".join(lines[last + 1 :])


# ----- mutations: each returns a valid rewrite of `text`, or None where it found nothing to rewrite --


def _wrapped(header: str, footer: str = "") -> Callable[[str, str], str]:
    def wrap(block: str, indentation: str) -> str:
        body = indented(textwrap.dedent(block))
        return indented(header + "\n" + body + footer, indentation)

    return wrap


WRAPS: Dict[str, Callable[[str, str], str]] = {
    "if": _wrapped("if True:"),
    "try": _wrapped("try:", "except Exception:\n    pass\n"),
    "with": _wrapped("with nullcontext():"),
    "for": _wrapped("for _ in range(1):"),
    "function": _wrapped("def _moved():", "_moved()\n"),
}


def wrap_statements(text: str, rnd: random.Random) -> Optional[str]:
    """Some consecutive statements wrapped in `if True:`, `try:`, `with`, `for`, or moved into a function."""
    ranges = line_ranges(text)
    if not ranges:
        return None
    first, last, indentation = rnd.choice(ranges)
    block = "".join(text.splitlines(keepends=True)[first : last + 1])
    wrap = WRAPS[rnd.choice(sorted(WRAPS))]
    return replace_lines(text, first, last, wrap(textwrap.dedent(block), indentation))


def duplicate_statements(text: str, rnd: random.Random) -> Optional[str]:
    ranges = line_ranges(text)
    if not ranges:
        return None
    first, last, _ = rnd.choice(ranges)
    block = with_newline("".join(text.splitlines(keepends=True)[first : last + 1]))
    return replace_lines(text, first, last, block + block)


def collapse_block(text: str, rnd: random.Random) -> Optional[str]:
    """A block of one-line simple statements joined onto its header's line: `if c: a; b`."""
    lines = text.splitlines()
    candidates = []
    for siblings in statement_lists(ast.parse(text)):
        header = siblings[0].lineno - 2
        if header < 0 or not lines[header].rstrip().endswith(":") or siblings[0] is ast.parse(text).body[0]:
            continue
        if all(is_simple(s) and s.lineno == s.end_lineno and owns_its_lines(lines, siblings, i) for i, s in enumerate(siblings)):
            candidates.append((header, siblings))
    if not candidates:
        return None
    header, siblings = rnd.choice(candidates)
    joined = "; ".join(_segment(lines[s.lineno - 1], s.col_offset, s.end_col_offset) for s in siblings)
    return replace_lines(text, header, siblings[-1].end_lineno - 1, lines[header].rstrip() + " " + joined)


MUTATIONS = (wrap_statements, duplicate_statements, collapse_block)


def mutated(text: str, rnd: random.Random, rounds: int) -> str:
    for _ in range(rounds):
        mutation = rnd.choice(MUTATIONS)
        candidate = mutation(text, rnd)
        if candidate is not None and parses(candidate):
            text = candidate
    return text


def rewrapped(text: str) -> str:
    """The whole module indented under `if True:`: the same program, one line down and four columns right."""
    return "if True:\n" + indented(text)


# ----- the program generator --------------------------------------------------------------------------

# Contexts a trigger snippet (a block at column 0) is put in. Each keeps the snippet's statements
# reachable by the analyses' standards, or deliberately not (dead code), and is valid around any block.
CONTEXTS: List[Callable[[str], str]] = [
    lambda b: "if flag:\n" + indented(b),
    lambda b: "if flag:\n    pass\nelif other:\n    pass\nelse:\n" + indented(b),
    lambda b: "while flag:\n" + indented(b) + "    break\n",
    lambda b: "for _i in range(2):\n" + indented(b) + "else:\n    pass\n",
    lambda b: "with open(path) as handle, lock:\n" + indented(b),
    lambda b: "try:\n" + indented(b) + "except (OSError, ValueError) as error:\n" + indented(b) + "finally:\n    pass\n",
    lambda b: "match command:\n    case [first, *rest] if rest:\n" + indented(b, " " * 8) + "    case {'k': _} | None:\n        pass\n    case _:\n" + indented(b, " " * 8),
    lambda b: "async def _serve(stream):\n    async with stream as s:\n        async for _item in s:\n" + indented(b, " " * 12) + "    await stream\n",
    lambda b: "@decorator\n@functools.lru_cache(maxsize=None)\ndef _decorated(*args, **kwargs):\n" + indented(b) + "_decorated()\n",
    lambda b: "def _recursive(n):\n    if n:\n        return _recursive(n - 1)\n" + indented(b) + "_recursive(3)\n",
    lambda b: "def _outer():\n    def _inner():\n" + indented(b, " " * 8) + "    return _inner()\n_outer()\n",
    lambda b: "def _dead():\n    return\n" + indented(b),
    lambda b: "for _i in items:\n    continue\n" + indented(b),
    lambda b: "class DataParallel(nn.Module):\n    pass\n" + b,
    lambda b: "class DataParallel(nn.DataParallel):\n" + indented(b),
    lambda b: "class _Model(nn.Module):\n    def other(self, x):\n" + indented(b, " " * 8) + "        return x\n    forward = other\n",
    lambda b: "class _Model(nn.Module):\n    forward = lambda self, x: [x.t() for _ in range(1)]\n" + b,
]
if sys.version_info >= (3, 11):
    CONTEXTS.append(lambda b: "try:\n" + indented(b) + "except* (ValueError, TypeError):\n" + indented(b))

# One-line headers a simple statement is put behind, as its whole suite.
ONE_LINE_HEADERS = ["if flag:", "while flag:", "for _i in items:", "with lock:", "try:", "else:", "def _f():", "class _C:"]


def _one_line_suite(statement: str, indentation: str, rnd: random.Random) -> str:
    header = rnd.choice(ONE_LINE_HEADERS)
    if header == "try:":
        return f"{indentation}try: {statement}\n{indentation}except Exception: pass\n"
    if header == "else:":
        return f"{indentation}if flag: pass\n{indentation}else: {statement}\n"
    return f"{indentation}{header} {statement}\n"


def _in_expression(statement: ast.stmt, source: str, rnd: random.Random) -> Optional[str]:
    """An expression statement (or an assignment's value) evaluated inside a lambda or a comprehension."""
    if not isinstance(statement, (ast.Expr, ast.Assign)) or isinstance(statement.value, (ast.Yield, ast.YieldFrom, ast.Await)):
        return None
    value = source
    if isinstance(statement, ast.Assign):
        value = _segment(source, statement.value.col_offset - statement.col_offset)
    form = rnd.choice(["(lambda: {})()", "[{} for _ in range(1)]", "{{_k: {} for _k in keys}}", "list({} for _ in items)", "(_v := {})"])
    wrapped = form.format(value)
    return wrapped if isinstance(statement, ast.Expr) else source[: len(source) - len(value)] + wrapped


def rewrite_simple_statements(block: str, rnd: random.Random) -> str:
    """Some one-line simple statements put behind one-line headers, inside expressions, or joined by `;`."""
    lines = block.splitlines(keepends=True)
    simple = {}
    for siblings in statement_lists(ast.parse(block)):
        for i, statement in enumerate(siblings):
            if is_simple(statement) and statement.lineno == statement.end_lineno and owns_its_lines(lines, siblings, i):
                simple[statement.lineno - 1] = statement
    out: List[str] = []
    joined_previous = False
    for index, line in enumerate(lines):
        statement = simple.get(index)
        if statement is None:
            out.append(line)
            joined_previous = False
            continue
        indentation = _indentation(line)
        text = _segment(line, statement.col_offset, statement.end_col_offset)
        choice = rnd.random()
        if choice < 0.2:
            out.append(_one_line_suite(text, indentation, rnd))
        elif choice < 0.35 and (inside := _in_expression(statement, text, rnd)) is not None:
            out.append(indentation + inside + "\n")
        elif choice < 0.5 and joined_previous is False and out and index - 1 in simple and _indentation(out[-1]) == indentation:
            out[-1] = out[-1].rstrip("\n") + "; " + text + "\n"
            joined_previous = True
            continue
        else:
            out.append(line)
        joined_previous = False
    return "".join(out)


def fragment(rnd: random.Random) -> str:
    """A trigger snippet, its simple statements rewritten, inside zero to three nested contexts."""
    block = rnd.choice(TRIGGERS)
    rewritten = rewrite_simple_statements(block, rnd)
    if parses(rewritten):
        block = rewritten
    for _ in range(rnd.choice([0, 1, 1, 2, 3])):
        candidate = rnd.choice(CONTEXTS)(block)
        if parses(candidate):
            block = candidate
    return block


def splice(program: str, block: str, rnd: random.Random) -> str:
    """`block` inserted before a random statement of `program` (at its depth), or else at its end."""
    program = with_newline(program)
    lines = program.splitlines(keepends=True)
    places = [(first, indentation) for first, _, indentation in line_ranges(program)]
    rnd.shuffle(places)
    for first, indentation in places[:4]:
        candidate = "".join(lines[:first]) + indented(block, indentation) + "".join(lines[first:])
        if parses(candidate):
            return candidate
    appended = program + block
    return appended if parses(appended) else block


def build_program(base: str, rnd: random.Random) -> str:
    program = base if parses(base) else ""
    for _ in range(rnd.randint(1, 4)):
        program = splice(program, fragment(rnd), rnd)
    return program


# Built once: building hypothesmith's strategies is what costs (about a second each).
BASE_PROGRAMS = hypothesmith.from_grammar() | hypothesmith.from_node()


@st.composite
def programs(draw) -> str:
    base = draw(BASE_PROGRAMS)
    return build_program(base, draw(st.randoms(use_true_random=False)))


# ----- linting ----------------------------------------------------------------------------------------


def lint_timed(text: str, name: str = "fuzzed.py") -> Tuple[FileResult, float]:
    """Lint `text` with every rule selected, through the public API; the result and the seconds it took."""
    file = SourceFile(filename=str(Path(name).absolute()), path=name, module_name=Path(name).stem, package="")
    start = time.perf_counter()
    result = lint_text(text, file, EVERY_RULE, cache=False)
    return result, time.perf_counter() - start


def assert_lints_cleanly(text: str) -> FileResult:
    result, seconds = lint_timed(text)
    assert not result.internal_errors, result.internal_errors[0].details
    assert seconds < SLOWEST_GENERATED_FILE_SECONDS, f"{seconds:.2f} s"
    return result


def codes_and_rows(result: FileResult, row_shift: int = 0) -> List[Tuple[str, int]]:
    return sorted((f.code, f.location.row + row_shift) for f in result.findings)


# ----- the generator's own guarantees ----------------------------------------------------------------


def test_every_rule_with_a_valid_example_has_triggers_in_the_generator():
    sources = set(TRIGGERS)
    for rule in CHECKS:
        assert any(example.source in sources for example in rule.INVALID), rule.code


@settings(max_examples=60, **FUZZ)
@given(st.randoms(use_true_random=False))
def test_generated_fragments_are_valid_and_keep_their_trigger(rnd):
    block = fragment(rnd)
    assert parses(block)
    program = splice("def f(x):\n    if x:\n        return 1\n    return 2\n", block, rnd)
    assert parses(program) and block.strip().splitlines()[-1].strip() in program


# ----- the fuzz tests ---------------------------------------------------------------------------------


@settings(max_examples=120, **FUZZ)
@given(programs())
def test_generated_programs_lint_without_internal_error_and_fast(program):
    assert parses(program)
    result = assert_lints_cleanly(program)
    unparsed = [f.message for f in result.findings if f.code == "DPL000"]
    assert not unparsed, unparsed  # the program is valid Python: a DPL000 would be a false "not checked"


FIXTURE_FILES = sorted(FIXTURES.rglob("*.py"))


@settings(max_examples=60, **FUZZ)
@given(st.sampled_from(FIXTURE_FILES), st.randoms(use_true_random=False), st.integers(1, 4))
def test_fixture_mutants_lint_without_internal_error(path, rnd, rounds):
    mutant = mutated(path.read_text(encoding="utf-8"), rnd, rounds)
    assert parses(mutant)
    assert_lints_cleanly(mutant)


@pytest.mark.parametrize("mutation", MUTATIONS, ids=lambda m: m.__name__)
def test_each_mutation_rewrites_some_fixture(mutation):
    """The mutation fuzz is not vacuous: each rewrite applies to the fixtures and keeps them valid."""
    rewritten = 0
    for path in FIXTURE_FILES:
        text = path.read_text(encoding="utf-8")
        candidate = mutation(text, random.Random(0))
        if candidate is not None and candidate != text and parses(candidate):
            rewritten += 1
    assert rewritten >= len(FIXTURE_FILES) // 2


@pytest.mark.parametrize("path", FIXTURE_FILES, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_a_pure_rewrap_keeps_every_finding(path):
    """`if True:` around the whole module: every finding keeps its code and message, one row down.

    Columns move four to the right on every line, so the comparison is (code, row, message); a rule
    that treated the module's top level differently from an always-taken branch would show here.
    """
    text = path.read_text(encoding="utf-8")
    original, _ = lint_timed(text, path.name)
    wrapped, _ = lint_timed(rewrapped(text), path.name)
    assert not wrapped.internal_errors
    before = sorted((f.code, f.location.row + 1, f.location.column + 4) for f in original.findings)
    after = sorted((f.code, f.location.row, f.location.column) for f in wrapped.findings)
    assert after == before
