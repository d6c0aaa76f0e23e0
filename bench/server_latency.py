"""Diagnostic latency of `dplint server`, measured through a real LSP client over stdio.

    python bench/server_latency.py [--runs 7] [--only cuda]

For each file a fresh `dplint server` is started and initialized. Cold: the time from sending
`textDocument/didOpen` to receiving its `publishDiagnostics` (the first lint, which also scans the
project for cross-file facts). Warm: the time from sending a `didChange` (one line edited, unsaved)
to receiving the diagnostics for that version; it includes the server's debounce. Alongside, the
engine's own time for the same text in this process (`check_file`, no server), to tell the server's
share from the linter's.

Files: a small training script (fixtures/discarded_move.py), and two of 2,000 lines: the example
programs of fixtures/ concatenated (every line multi-GPU torch code: the worst case for the rules)
and torch's own `torch/cuda/__init__.py` (library code that passes the prefilters and is parsed).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

from lsprotocol import types
from pygls.lsp.client import LanguageClient

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
LINES = 2000


def dense_program(lines: int = LINES) -> str:
    """The fixtures' programs, one after another, cut at a statement boundary near `lines` lines."""
    import ast

    parts = []
    for path in sorted(FIXTURES.glob("*.py")):
        if path.name.endswith(".fixed.py") or path.name.startswith("tf_"):
            continue
        parts.append("\n".join(line for line in path.read_text().splitlines() if not line.startswith("from __future__")))
    body = "\n\n".join(parts)
    text = body
    while text.count("\n") < lines:
        text += "\n\n" + body
    rows = text.splitlines()[:lines]
    while rows:
        try:
            ast.parse("\n".join(rows))
            return "\n".join(rows) + "\n"
        except SyntaxError:
            rows.pop()
    raise RuntimeError("no parseable prefix")


def files() -> Dict[str, str]:
    chosen = {"small (fixtures/discarded_move.py)": (FIXTURES / "discarded_move.py").read_text()}
    chosen[f"{LINES:,} lines, dense (fixtures concatenated)"] = dense_program()
    try:
        import torch

        cuda_init = Path(torch.__file__).parent / "cuda" / "__init__.py"
        chosen[f"{cuda_init.read_text().count(chr(10)):,} lines, torch/cuda/__init__.py"] = cuda_init.read_text()
    except ImportError:
        print("torch is not installed: skipping torch/cuda/__init__.py", file=sys.stderr)
    return chosen


class Client(LanguageClient):
    def __init__(self) -> None:
        super().__init__("dplint-bench", "1")
        self.published: Dict[Tuple[str, int], float] = {}
        self.arrived = asyncio.Event()

        @self.feature(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
        def on_diagnostics(params: types.PublishDiagnosticsParams) -> None:
            self.published[(params.uri, params.version)] = time.perf_counter()
            self.arrived.set()

    async def published_at(self, uri: str, version: int) -> float:
        while (uri, version) not in self.published:
            self.arrived.clear()
            await asyncio.wait_for(self.arrived.wait(), 120)
        return self.published[(uri, version)]


async def measure(name: str, text: str, runs: int) -> Tuple[float, List[float]]:
    with tempfile.TemporaryDirectory() as directory:
        workspace = Path(directory)
        (workspace / "pyproject.toml").write_text('[project]\nname = "bench"\n')
        path = workspace / "train.py"
        path.write_text(text)
        uri = path.as_uri()
        client = Client()
        await client.start_io(sys.executable, "-m", "dplint", "server")
        try:
            await client.initialize_async(
                types.InitializeParams(capabilities=types.ClientCapabilities(), root_uri=workspace.as_uri())
            )
            client.initialized(types.InitializedParams())
            sent = time.perf_counter()
            client.text_document_did_open(types.DidOpenTextDocumentParams(types.TextDocumentItem(uri, "python", 1, text)))
            cold = await client.published_at(uri, 1) - sent
            warm = []
            last = len(text.splitlines())
            for version in range(2, runs + 2):
                edit = types.TextDocumentContentChangePartial(
                    range=types.Range(types.Position(last, 0), types.Position(last, 0)), text=f"# edit {version}\n"
                )
                last += 1
                await asyncio.sleep(0.3)  # a pause in typing: each edit is linted on its own
                sent = time.perf_counter()
                client.text_document_did_change(
                    types.DidChangeTextDocumentParams(types.VersionedTextDocumentIdentifier(version, uri), [edit])
                )
                warm.append(await client.published_at(uri, version) - sent)
            await client.shutdown_async(None)
            client.exit(None)
        finally:
            await client.stop()
    return cold, warm


def engine_time(text: str, runs: int) -> float:
    from dplint.analysis.facts import ProjectFacts, collect_file_facts
    from dplint.api import default_settings
    from dplint.engine import SourceFile, check_file

    source = SourceFile("/bench/train.py", "train.py", "train", "")
    settings = default_settings()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        facts = collect_file_facts(text, source.module_name, source.package, source.path, source.filename)
        check_file(source, text, settings, ProjectFacts.build([facts]), facts)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="warm edits per file (default: 7)")
    parser.add_argument("--only", default="", help="only the files whose name holds this text")
    args = parser.parse_args()
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}; milliseconds")
    print(f"{'file':<48} {'cold':>7} {'warm median':>12} {'warm min-max':>14} {'engine':>8}")
    for name, text in files().items():
        if args.only not in name:
            continue
        cold, warm = asyncio.run(measure(name, text, args.runs))
        engine = engine_time(text, 3)
        spread = f"{min(warm) * 1000:.0f}-{max(warm) * 1000:.0f}"
        print(f"{name:<48} {cold * 1000:>7.0f} {statistics.median(warm) * 1000:>12.0f} {spread:>14} {engine * 1000:>8.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
