"""The lint pipeline: read, prefilter, parse, check, suppress, locate.

Pass 1 (`scan`) reads every file and collects its project-level facts; pass 2 (`check_file`) parses
every file with CPython's parser (a syntax error is DPL000 wherever it is) and lints only files whose
text can match an enabled rule. Both passes run in worker processes when there is enough work, and
both are cached per file.
"""

from __future__ import annotations

import ast
import contextlib
import gc
import hashlib
import io
import multiprocessing
import os
import re
import sys
import threading
import tokenize
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple, TypeVar

from dplint.config import Settings
from dplint.analysis.facts import FileFacts, ProjectFacts, collect_file_facts, module_identity
from dplint.analysis.outline import Outline
from dplint.finding import Edit, Finding, Fix, Location, display_path
from dplint.rule import Report, Rule, SuppressionRule
from dplint.noqa import Suppressions, noqa_directives

MAX_FILE_BYTES = 10 * 1024 * 1024
# libcst's parser is quadratic in the depth of left-recursive chains (`x.t().t()…`, `x[0][0]…`):
# measured here, a 1,000-deep subscript chain takes 1.5 s to parse and 3.8 s to lint, 2,000 deep 34 s
# to parse. 500 levels keeps the worst chain's lint near 1 s; real code stays under 40.
MAX_EXPRESSION_DEPTH = 500
# Below this many files, starting worker processes costs more than it saves.
PARALLEL_THRESHOLD = 24

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class InternalError:
    path: str
    code: str
    details: str


@dataclass(frozen=True)
class FileResult:
    findings: Tuple[Finding, ...] = ()
    internal_errors: Tuple[InternalError, ...] = ()
    unparsed: bool = False  # no rule looked at it, and nothing parsed it: its syntax is unchecked
    does_not_parse: bool = False  # no rule looked at it, and it does not parse: named in the run's summary


@dataclass(frozen=True)
class SourceFile:
    """A file as the run sees it: where it is, how it is shown, and its module name."""

    filename: str  # absolute
    path: str  # shown to the user
    module_name: str
    package: str  # where relative imports start


class Unreadable(Exception):
    """The file's bytes are not source text; the message says why."""


_CODING_COOKIE = re.compile(rb"^[ \t\f]*#.*?coding[:=]", re.M)


def decode(data: bytes) -> str:
    return decode_with_encoding(data)[0]


def decode_with_encoding(data: bytes) -> Tuple[str, str]:
    """The text, decoded as Python would (coding cookie, BOM), and the encoding used."""
    if b"\0" in data:
        raise Unreadable("binary file (it contains NUL bytes); not Python source")
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as error:
        if _CODING_COOKIE.search(b"\n".join(data.splitlines()[:2])):
            raise Unreadable(f"cannot decode: {error.msg}") from None
        encoding = "utf-8"  # undecodable bytes in the first lines: let the decoder say where
    try:
        return data.decode(encoding), encoding
    except UnicodeDecodeError as error:
        raise Unreadable(f"cannot decode as {encoding} at byte {error.start}: {error.reason}; save the file as UTF-8") from None


def read_bytes(filename: str) -> bytes:
    try:
        size = os.path.getsize(filename)
        if size > MAX_FILE_BYTES:
            raise Unreadable(f"file too large to lint ({size / 2**20:.1f} MiB; the limit is {MAX_FILE_BYTES // 2**20} MiB)")
        with open(filename, "rb") as handle:
            return handle.read()
    except OSError as error:
        raise Unreadable(f"cannot read: {error.strerror or error}") from None


def content_hash(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def parse(text: str):
    """A libcst Module, or Unreadable with the reason and line."""
    return parse_libcst(text, parse_python(text))


def parse_python(text: str) -> ast.Module:
    """CPython's tree of the file, or Unreadable with the reason and line.

    CPython's own parser decides what is Python: a file it rejects is not checked, even where libcst
    would parse it (`"\\N{BOGUS}"`). It runs first also because it is fast, gives the clearest syntax
    errors, and rejects pathological nesting that would overflow libcst's native parser's stack.
    """
    try:
        return ast.parse(text)
    except (RecursionError, MemoryError):
        raise Unreadable("too deeply nested to parse") from None
    except SyntaxError as error:
        raise _syntax_error(error.msg or "invalid syntax", error, text) from None


def parse_libcst(text: str, tree: ast.Module):
    """The libcst Module of a file CPython parsed as `tree`, or Unreadable with the reason."""
    return StatementTrees().module(text, tree)


class StatementTrees:
    """libcst's trees of a file's top-level statements, by their text, kept from its last parse.

    Each group of top-level statements that shares no line with another is parsed on its own, and
    the trees are joined into one Module equal to libcst's parse of the whole text (positions come
    from that Module's code generation, so they follow the lines above). Kept for a document between
    its parses (the language server's), only the groups an edit touched are parsed again. Pieces are
    also faster on long files, where libcst's parser slows down: 40,000 lines took 8 s whole, 3 s in pieces.
    """

    def __init__(self) -> None:
        # text → the trees parsed from it (a text may repeat in a file; each place gets its own nodes),
        # each with whether it has an indented block
        self._kept: Dict[str, List[Tuple[object, bool]]] = {}

    def module(self, text: str, tree: ast.Module):
        """The libcst Module of a file CPython parsed as `tree`, or Unreadable with the reason."""
        import libcst as cst

        try:
            with _parser_output_trusted():
                module = self._joined(text, tree) if "\r" not in text else None
                if module is None:  # the pieces would not join into the whole's tree: parse it whole
                    depth, data_literals = _shape(tree)
                    if depth > MAX_EXPRESSION_DEPTH:
                        raise _too_deep(depth)
                    module = cst.parse_module(_blanked(text, data_literals))
                return module
        except RecursionError:
            raise Unreadable("too deeply nested to parse") from None
        except Unreadable:
            raise
        except Exception as error:  # libcst rejects a few constructs CPython accepts
            raise Unreadable(f"libcst cannot parse this file, though Python can: {str(error).splitlines()[0].rstrip('.')}") from None

    def _joined(self, text: str, tree: ast.Module):
        """The pieces' trees joined, or None where a piece's indentation differs from the file's (the
        blocks that indent as the file's first one does record no indentation of their own) or libcst
        rejects a piece (parsed whole, the error then names the file's own line)."""
        import libcst as cst

        kept, self._kept = self._kept, {}
        pieces = []
        for piece, first_line, statements in _pieces(text, tree):
            trees = kept.get(piece)
            if trees:
                parsed = trees.pop()
            else:
                depth, data_literals = 0, []
                for statement in statements:
                    deepest, literals = _shape(statement)
                    depth, data_literals = max(depth, deepest), data_literals + literals
                if depth > MAX_EXPRESSION_DEPTH:
                    raise _too_deep(_shape(tree)[0])  # the file's deepest, as the whole's check says
                try:
                    piece_module = cst.parse_module(_blanked(piece, data_literals, first_line))
                except Exception:
                    return None
                parsed = (piece_module, any(_indents(statement) for statement in piece_module.body))
            self._kept.setdefault(piece, []).append(parsed)
            pieces.append(parsed)
        indent = None
        for piece_module, indented in pieces:
            if indented:
                indent = indent or piece_module.default_indent
                if piece_module.default_indent != indent:
                    return None
        body: List[object] = []
        between: Tuple[object, ...] = ()  # what follows a piece's last statement: the next one's leading lines
        for index, (piece_module, _) in enumerate(pieces):
            statements = list(piece_module.body)
            leading = (*between, *piece_module.header) if index else ()
            if leading:
                statements[0] = statements[0].with_changes(leading_lines=(*leading, *statements[0].leading_lines))
            body += statements
            between = piece_module.footer
        first, last = pieces[0][0], pieces[-1][0]
        return first.with_changes(
            body=body, footer=last.footer, default_indent=indent or first.default_indent, has_trailing_newline=last.has_trailing_newline
        )


def statement_groups(tree: ast.Module) -> List[Tuple[int, List[ast.stmt]]]:
    """(first line, statements) of each group of top-level statements that shares no line with another:
    one libcst statement each. The first line is the first decorator's, if any."""
    groups: List[Tuple[int, List[ast.stmt]]] = []
    for statement in tree.body:
        starts = min([statement.lineno, *(decorator.lineno for decorator in getattr(statement, "decorator_list", ()))])
        if groups and starts <= groups[-1][1][-1].end_lineno:  # type: ignore[operator]
            groups[-1][1].append(statement)
        else:
            groups.append((starts, [statement]))
    return groups


def _pieces(text: str, tree: ast.Module) -> Iterator[Tuple[str, int, List[ast.stmt]]]:
    """(text, first line, statements) of each statement group: the lines between two groups belong to
    the first, the lines above the first statement too."""
    line_starts = [0]
    line_starts += [match.end() for match in re.finditer("\n", text)]
    groups = statement_groups(tree) or [(1, [])]
    for index, (starts, statements) in enumerate(groups):
        first_line = 1 if index == 0 else starts
        end = line_starts[groups[index + 1][0] - 1] if index + 1 < len(groups) else len(text)
        yield text[line_starts[first_line - 1] : end], first_line, statements


def _indents(statement) -> bool:
    """Whether a top-level statement has an indented block (the blocks inside one are in it)."""
    import libcst as cst

    if isinstance(statement, cst.Match):
        return True
    if not isinstance(statement, cst.BaseCompoundStatement):
        return False
    suites = [statement.body, *(handler.body for handler in getattr(statement, "handlers", ()))]
    orelse = getattr(statement, "orelse", None)
    while orelse is not None:
        suites.append(orelse.body)
        orelse = orelse.orelse if isinstance(orelse, cst.If) else None
    final = getattr(statement, "finalbody", None)
    if final is not None:
        suites.append(final.body)
    return any(isinstance(suite, cst.IndentedBlock) for suite in suites)


def _too_deep(depth: int) -> Unreadable:
    return Unreadable(f"too deeply nested to check (an expression {depth} levels deep; the limit is {MAX_EXPRESSION_DEPTH})")


_PARSING = threading.Lock()


@contextlib.contextmanager
def _parser_output_trusted() -> Iterator[None]:
    """Builds libcst nodes without their `_validate` checks, which guard trees built by hand: the
    parser's output is valid by construction, and the checks were about 15 % of the parse on torch's
    sources. The lock keeps two threads (the language server's) from restoring each other's swap."""
    from libcst._nodes.base import CSTNode

    with _PARSING:
        validating = CSTNode.__post_init__
        CSTNode.__post_init__ = _trusted  # type: ignore[method-assign]
        try:
            yield
        finally:
            CSTNode.__post_init__ = validating  # type: ignore[method-assign]


def _trusted(node: object) -> None:
    pass


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Runs without the cyclic garbage collector. Parsing and checking a file allocate millions of
    objects that live until the file is done; collecting as they grew cost about a sixth of the checking.
    The garbage of the file is collected once, at the first allocation after."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _shape(tree: ast.AST) -> Tuple[int, List[ast.expr]]:
    """How deeply expressions nest inside one statement, and the large literals made only of constants.

    Statements do not count towards the depth: CPython bounds their nesting, and libcst handles long
    `elif` chains well. The walk is iterative (deep trees are the point), skips the data literals, and
    reads the fields itself without visiting `Load`/`Store` leaves: `ast.iter_child_nodes` took twice
    as long.
    """
    deepest = 0
    data_literals: List[ast.expr] = []
    pending: List[Tuple[ast.AST, int]] = [(tree, 0)]
    while pending:
        node, depth = pending.pop()
        if depth > deepest:
            deepest = depth
        if isinstance(node, _DISPLAYS) and _is_data_literal(node):
            data_literals.append(node)  # type: ignore[arg-type]
            continue
        for name in node._fields:
            value = getattr(node, name, None)
            for child in value if isinstance(value, list) else (value,):
                if isinstance(child, ast.AST) and not isinstance(child, ast.expr_context):
                    pending.append((child, depth + 1 if isinstance(child, ast.expr) else 0))
    return deepest, data_literals


_DISPLAYS = (ast.List, ast.Tuple, ast.Set, ast.Dict)


# A display of this many constants is data (a table, a vocabulary, weights): no rule looks inside, and
# libcst would spend seconds on it (a 200,000-element list: 14 s to parse and locate).
DATA_LITERAL_SIZE = 1000


def _is_data_literal(node: ast.AST) -> bool:
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        elements = node.elts
    elif isinstance(node, ast.Dict):
        elements = [*node.keys, *node.values]
    else:
        return False
    return len(elements) >= DATA_LITERAL_SIZE and all(
        isinstance(e, ast.Constant) or (isinstance(e, ast.UnaryOp) and isinstance(e.operand, ast.Constant)) for e in elements
    )


def _blanked(text: str, data_literals: Sequence[ast.expr], first_line: int = 1) -> str:
    """The text (the file's from `first_line` on) with the inside of each bracketed data literal
    blanked: rows and columns stay put."""
    if not data_literals or "\r" in text:
        return text
    line_starts = [0]
    for line in text.split("\n"):
        line_starts.append(line_starts[-1] + len(line) + 1)

    def offset(row: int, byte_column: int) -> int:
        row -= first_line - 1
        start = line_starts[row - 1]
        line = text[start : line_starts[row] - 1]
        return start + len(line.encode("utf-8")[:byte_column].decode("utf-8", errors="replace"))

    pieces: List[str] = []
    done = 0
    for literal in sorted(data_literals, key=lambda node: (node.lineno, node.col_offset)):
        start = offset(literal.lineno, literal.col_offset)
        end = offset(literal.end_lineno or literal.lineno, literal.end_col_offset or 0)
        if start < done or text[start] not in "([{" or text[end - 1] not in ")]}":
            continue  # an unbracketed tuple (`x = 1, 2, …`): leave it to libcst
        pieces += [text[done : start + 1], re.sub(r"[^\n]", " ", text[start + 1 : end - 1])]
        done = end - 1
    return "".join(pieces) + text[done:]


class _LocatedUnreadable(Unreadable):
    def __init__(self, message: str, line: int, column: int) -> None:
        super().__init__(message)
        self.line = line
        self.column = column


def _syntax_error(message: str, error: SyntaxError, text: str) -> Unreadable:
    newer = _newer_syntax(error, text)
    if newer is not None:
        running = f"{sys.version_info.major}.{sys.version_info.minor}"
        message = f"{newer} needs Python 3.12 or newer; dplint runs on Python {running}"
    return _LocatedUnreadable(f"syntax error: {message}", error.lineno or 1, max(error.offset or 1, 1))


# Python 3.12 syntax on the line CPython stopped at. Before 3.12, `type NAME` and `def NAME[` /
# `class NAME[` are errors wherever they appear, so the line alone tells.
_TYPE_STATEMENT = re.compile(r"\s*type\s+[A-Za-z_]\w*\s*[\[=]")
_TYPE_PARAMETERS = re.compile(r"\s*(?:async\s+def|def|class)\s+[A-Za-z_]\w*\s*\[")
_F_STRING_START = re.compile(r"(?<![\w'\"])(?:[rR]?[fF]|[fF][rR])['\"]")
# A line of more nested brackets than this is not handed to libcst to try (its parser's stack is native).
_SNIPPET_MAX_DEPTH = 100


def _newer_syntax(error: SyntaxError, text: str) -> Optional[str]:
    """The Python 3.12 construct (PEP 695, PEP 701) that an older CPython rejected, when it can be told."""
    if sys.version_info >= (3, 12) or not error.lineno or error.text is None:
        return None
    line = error.text.rstrip("\n")
    if _TYPE_STATEMENT.match(line):
        return "a `type` statement (PEP 695)"
    if _TYPE_PARAMETERS.match(line):
        return "a type parameter list (PEP 695)"
    if _F_STRING_START.search(line) and not (error.msg or "").startswith("(unicode error)") and (
        _parses_as_f_string(line) or _parses_as_f_string(text)
    ):  # the line alone, else the whole file: an f-string whose braces span lines (PEP 701 too)
        return "an f-string with quotes, backslashes, comments or line breaks inside its braces (PEP 701)"
    return None


def _parses_as_f_string(line: str) -> bool:
    """Whether libcst, which knows Python 3.12's f-strings, reads the line (or lines) as statements holding one."""
    import libcst as cst
    import libcst.matchers as m

    depth = deepest = 0
    for char in line:
        depth += (char in "([{") - (char in ")]}")
        deepest = max(deepest, depth)
    if deepest > _SNIPPET_MAX_DEPTH:
        return False
    try:
        statement = cst.parse_module(line.strip() + "\n")
    except Exception:  # not a whole statement on its own: no claim
        return False
    return bool(m.findall(statement, m.FormattedString()))


def parse_error_finding(source: SourceFile, error: Unreadable) -> Finding:
    from dplint.rules import ParseError

    line = getattr(error, "line", 1)
    column = getattr(error, "column", 1)
    return Finding(
        code=ParseError.code,
        name=ParseError.name,
        severity=ParseError.severity,
        message=f"{error}. The file was not checked.",
        help="Fix the file, or exclude it with `extend-exclude` if it is not Python source.",
        path=source.path,
        filename=source.filename,
        location=Location(line, column),
        end_location=Location(line, column),
    )


def scan(source: SourceFile) -> Tuple[Optional[FileFacts], str]:
    """Pass 1: the file's project-level facts (None when it cannot be read) and its content hash."""
    try:
        data = read_bytes(source.filename)
    except Unreadable:
        return None, ""
    try:
        text = universal_newlines(decode(data))
    except Unreadable:
        return None, content_hash(data)
    try:
        facts = collect_file_facts(text, source.module_name, source.package, source.path, source.filename)
    except RecursionError:  # the file's own check reports it as DPL000 "too deeply nested"
        facts = None
    return facts, content_hash(data)


def universal_newlines(text: str) -> str:
    """CR and CRLF line endings as LF, as Python reads source: lines and columns stay where they were."""
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text


def prefilter_text(text: str) -> str:
    """The text the rules' line-based triggers search: a form feed is whitespace before a statement."""
    return text.replace("\f", " ") if "\f" in text else text


def check_file(
    source: SourceFile,
    text: Optional[str],
    settings: Settings,
    project: ProjectFacts,
    facts: Optional[FileFacts],
    statements: Optional[StatementTrees] = None,
) -> FileResult:
    """Pass 2: lint one file with the enabled rules that can match its text. `statements`: the trees
    kept from the file's last parse, which this parse reuses and replaces (an editor's document)."""
    with collector_paused():
        return _check_file(source, text, settings, project, facts, statements)


def _check_file(
    source: SourceFile,
    text: Optional[str],
    settings: Settings,
    project: ProjectFacts,
    facts: Optional[FileFacts],
    statements: Optional[StatementTrees],
) -> FileResult:
    try:
        if text is None:
            text = decode(read_bytes(source.filename))
    except Unreadable as error:
        return FileResult((parse_error_finding(source, error),))
    text = universal_newlines(text)
    # The rules and libcst load in the first file checked: a run answered from the cache never needs them.
    from dplint.rules import CHECKS

    ignored = settings.ignored_for(Path(source.filename))
    classes = facts.class_names if facts is not None else ()
    enabled = (rule() for rule in CHECKS if rule.code in settings.enabled and rule.code not in ignored)
    searched = prefilter_text(text)
    in_program = project.distributed.program_of(source.filename) is not None
    rules = [
        rule
        for rule in enabled
        if (in_program or rule.outside_distributed_programs(project)) and rule.applies_to(searched, classes, project)
    ]
    if not rules:
        # Not parsed again: pass 1 parsed every project file, and one that does not parse is named in the
        # summary, not reported (a DPL000 is for a file some rule would check: on code nobody here had
        # read, those elsewhere were test inputs, templates and vendored Python 2, moot to a user). A torch
        # library's own module pass 1 did not parse: the run says how many.
        parses = facts.parses if facts is not None else None
        return FileResult(unparsed=parses is None, does_not_parse=parses is False)
    try:
        tree = parse_python(text)
        outline = Outline.of(tree)
        rules = [rule for rule in rules if rule.applies_to_outline(outline)]
        if not rules:
            return FileResult()
        module = parse_libcst(text, tree) if statements is None else statements.module(text, tree)
    except Unreadable as error:
        return FileResult((parse_error_finding(source, error),))
    return run_rules(source, text, module, rules, project, tree)


def run_rules(
    source: SourceFile, text: str, module, rules: Sequence[Rule], project: ProjectFacts, tree: Optional[ast.Module] = None
) -> FileResult:
    """`tree`: CPython's tree of the same text, which tells where each top-level statement starts."""
    from dplint.analysis.context import FileContext

    lines = [starts for starts, _ in statement_groups(tree)] if tree is not None else None
    ctx = FileContext(
        path=source.path,
        filename=source.filename,
        source=text,
        module=module,
        project=project,
        module_name=source.module_name,
        package=source.package,
        statement_lines=lines if lines is not None and len(lines) == len(module.body) else None,
        tree=tree,
    )
    suppressions = Suppressions(text)
    findings: List[Finding] = []
    errors: List[InternalError] = []
    noqa_rules = [rule for rule in rules if isinstance(rule, SuppressionRule) and not suppressions.file_ignores(rule.code)]
    node_rules = [rule for rule in rules if not isinstance(rule, SuppressionRule)]
    for rule in node_rules:
        if suppressions.file_ignores(rule.code):
            continue
        try:
            for report in rule.check(ctx):
                finding = _locate(rule, report, ctx, source)
                if not suppressions.line_ignores(finding):
                    findings.append(finding)
        except RecursionError:
            findings.append(parse_error_finding(source, Unreadable("too deeply nested to analyse")))
        except Exception:
            errors.append(InternalError(source.path, rule.code, traceback.format_exc()))
    if noqa_rules:
        if any(rule.judges_use for rule in noqa_rules):
            errors += _record_noqa_use_of_other_rules(ctx, source, suppressions, {rule.code for rule in node_rules})
        suppressions.undecided |= {error.code for error in errors}
        directives = noqa_directives(text)
        for rule in noqa_rules:
            try:
                findings += [f for f in rule.check_directives(ctx, directives, suppressions) if not suppressions.line_ignores(f)]
            except Exception:
                errors.append(InternalError(source.path, rule.code, traceback.format_exc()))
    return FileResult(tuple(findings), tuple(errors))


def _record_noqa_use_of_other_rules(ctx, source: SourceFile, suppressions: Suppressions, ran: Set[str]) -> List[InternalError]:
    """Run the static rules that a `# noqa` names but this run did not (deselected, or skipped by the
    prefilter), only to record which directives they would use: their findings are not reported."""
    from dplint.rules import CHECKS

    errors: List[InternalError] = []
    named = suppressions.named_codes()
    for rule_class in CHECKS:
        if rule_class.code in ran or rule_class.code not in named or issubclass(rule_class, SuppressionRule):
            continue
        try:
            for report in rule_class().check(ctx):
                suppressions.line_ignores(_locate(rule_class, report, ctx, source))
        except RecursionError:
            suppressions.undecided.add(rule_class.code)
        except Exception:
            errors.append(InternalError(source.path, rule_class.code, traceback.format_exc()))
    return errors


def _locate(rule: Rule, report: Report, ctx, source: SourceFile) -> Finding:
    from dplint.analysis.names import position_anchor

    span = ctx.position(position_anchor(report.node))
    fix = None
    if report.fix is not None:
        edits = []
        for edit in report.fix.edits:
            where = ctx.position(position_anchor(edit.node))
            start = Location(where.start.line, where.start.column + 1)
            end = Location(where.end.line, where.end.column + 1)
            if edit.insert_before:
                end = start
            elif edit.insert_after:
                start = end
            edits.append(Edit(edit.content, start, end))
        fix = Fix(report.fix.applicability, report.fix.message, tuple(edits))
    return Finding(
        code=rule.code,
        name=rule.name,
        severity=rule.severity,
        message=report.message,
        help=report.help,
        path=source.path,
        filename=source.filename,
        location=Location(span.start.line, span.start.column + 1),
        end_location=Location(span.end.line, span.end.column + 1),
        fix=fix,
        noqa_row=ctx.line(position_anchor(report.statement)) if report.statement is not None else span.start.line,
        references=report.references,
    )


# ----- running many files ---------------------------------------------------------------------------

_worker_state: Dict[str, object] = {}


def _init_worker(settings: Settings, project: Optional[ProjectFacts]) -> None:
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    _worker_state["settings"] = settings
    _worker_state["project"] = project


def check_task(item: Tuple[SourceFile, Optional[FileFacts]]) -> FileResult:
    source, facts = item
    return check_file(source, None, _worker_state["settings"], _worker_state["project"], facts)  # type: ignore[arg-type]


def run_parallel(
    function: Callable[[T], R],
    items: Sequence[T],
    jobs: int,
    settings: Settings,
    project: Optional[ProjectFacts],
    on_result: Optional[Callable[[], None]] = None,
    cost: Optional[Callable[[T], int]] = None,
) -> List[R]:
    """`function` over `items` on `jobs` processes, results in the order of `items`.

    With `cost`, the costliest items go first, in small chunks: a tree's few big files (torch's test
    suites) would otherwise share one chunk and leave the other workers idle at the end.
    """
    if jobs <= 1 or len(items) < PARALLEL_THRESHOLD:
        _init_worker(settings, project)
        return [_reported(function(item), on_result) for item in items]
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    context = multiprocessing.get_context(method)
    order = sorted(range(len(items)), key=lambda index: -cost(items[index])) if cost else list(range(len(items)))
    chunksize = 2 if cost else max(1, min(64, len(items) // (jobs * 8)))
    results: List[Optional[R]] = [None] * len(items)
    with context.Pool(jobs, initializer=_init_worker, initargs=(settings, project)) as pool:
        for index, result in zip(order, pool.imap(function, [items[i] for i in order], chunksize=chunksize)):
            results[index] = _reported(result, on_result)
    return results  # type: ignore[return-value]


def _reported(result: R, on_result: Optional[Callable[[], None]]) -> R:
    if on_result is not None:
        on_result()
    return result


def source_files(paths: Sequence[Path]) -> List[SourceFile]:
    """A SourceFile for each path; the folders' package names are looked up once for all of them.

    A file under the current folder is shown relative to it; one outside it as the user gave it
    (`/data/train.py`, `../train.py`), not as a climb of `../` from here."""
    cwd = os.getcwd()
    packages: Dict[str, str] = {}
    shown_folders: Dict[str, str] = {}
    sources = []
    for path in paths:
        absolute = os.path.abspath(path)
        folder, name = os.path.split(absolute)
        if folder not in shown_folders:
            inside = folder == cwd or folder.startswith(cwd + os.sep)
            shown_folders[folder] = display_path(folder, cwd) if inside else os.path.dirname(os.path.normpath(path))
        shown = name if shown_folders[folder] == "." else os.path.join(shown_folders[folder], name)
        sources.append(SourceFile(absolute, shown, *module_identity(absolute, packages)))
    return sources


def source_file(path: Path) -> SourceFile:
    return source_files([path])[0]


def relocated(finding: Finding, shown: str) -> Finding:
    return finding if finding.path == shown else replace(finding, path=shown)
