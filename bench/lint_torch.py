"""Benchmark: lint the installed torch package's own sources (thousands of files), cold and warm.

    python bench/lint_torch.py [--jobs N] [--tree PATH] [--file RELATIVE] [--select CODES]

Cold: a fresh cache folder, so every file is read, scanned and (if the prefilter keeps it) parsed.
Warm: the same command again, answered from the cache. Each run is a separate `dplint` process, as a
user would start it; peak memory is the largest resident set of that process tree.

Then the pre-commit case: one staged file of that tree, named alone, with the whole tree as the
project (`--project-root`), so its facts come from every file: cold (fresh cache) and warm.
`--select` times a part of the catalogue (e.g. `DPL1,DPL2,DPL3,DPL4`: the rules without the
distributed ones), as `dplint --select` would.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path


def torch_sources() -> Path:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("torch is not installed: pip install torch (or pass --tree PATH)")
    return Path(list(spec.submodule_search_locations)[0])


# Runs the command and reports the peak resident memory of its process tree on the last stderr line:
# RUSAGE_CHILDREN is a running maximum, so each measured run needs a fresh parent.
_MEASURE = (
    "import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); sys.exit(r.returncode)"
)


def run(tree: Path, cache_root: Path, jobs: int, *options: str) -> tuple:
    command = [sys.executable, "-m", "dplint", "--format", "json", "--exit-zero", "-j", str(jobs), *options, str(tree)]
    start = time.perf_counter()
    completed = subprocess.run([sys.executable, "-c", _MEASURE, *command], cwd=cache_root, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if completed.returncode != 0:
        sys.exit(f"dplint failed ({completed.returncode}):\n{completed.stderr}")
    peak_mib = int(completed.stderr.strip().splitlines()[-1]) / 1024
    return elapsed, peak_mib, json.loads(completed.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--tree", type=Path, help="the tree to lint (default: the installed torch package)")
    parser.add_argument("--file", default="nn/parallel/data_parallel.py", help="the one staged file, relative to the tree")
    parser.add_argument("--select", help="the codes or prefixes to enable (default: the configured rules)")
    args = parser.parse_args()
    selected = ("--select", args.select) if args.select else ()
    tree = (args.tree or torch_sources()).resolve()
    files = sum(1 for p in tree.rglob("*") if p.suffix in (".py", ".pyi"))
    lines = sum(p.read_bytes().count(b"\n") for p in tree.rglob("*") if p.suffix in (".py", ".pyi"))
    with tempfile.TemporaryDirectory() as cache_root:
        cold, cold_mib, findings = run(tree, Path(cache_root), args.jobs, *selected)
        warm, warm_mib, warm_findings = run(tree, Path(cache_root), args.jobs, *selected)
    assert warm_findings == findings, "the warm run must report what the cold run reported"
    print(f"tree: {tree} ({files} files, {lines / 1e6:.2f} M lines), jobs: {args.jobs}, rules: {args.select or 'configured'}")
    print(f"cold: {cold:6.2f} s  {files / cold:8.0f} files/s  peak {cold_mib:.0f} MiB")
    print(f"warm: {warm:6.2f} s  {files / warm:8.0f} files/s  peak {warm_mib:.0f} MiB")
    counts = Counter(f["code"] for f in findings)
    print("findings:", ", ".join(f"{code} {count}" for code, count in sorted(counts.items())) or "none")

    staged = tree / args.file
    with tempfile.TemporaryDirectory() as cache_root:
        one_cold, one_cold_mib, _ = run(staged, Path(cache_root), args.jobs, *selected, "--project-root", str(tree))
        one_warm, one_warm_mib, _ = run(staged, Path(cache_root), args.jobs, *selected, "--project-root", str(tree))
    print(f"one staged file ({args.file}), facts from all {files} files:")
    print(f"  cold: {one_cold:6.2f} s  peak {one_cold_mib:.0f} MiB")
    print(f"  warm: {one_warm:6.2f} s  peak {one_warm_mib:.0f} MiB")


if __name__ == "__main__":
    main()
