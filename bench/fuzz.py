"""The long fuzz run: lint thousands of generated programs with every rule; report any crash.

    python bench/fuzz.py                      # 10,000 programs, seed 0, one worker per core
    python bench/fuzz.py --count 500 --seed 7 --jobs 1 --crashes /tmp/crashes
    python bench/fuzz.py --pathological       # time each pathological file instead, issue 21's shapes at full size

The programs come from `programs()` in tests/test_fuzz.py (hypothesmith programs with the rules'
trigger snippets spliced in): the CI test runs the same generator for a few hundred examples. Each
worker runs its share with its own seed, so a run is reproducible from (count, seed, jobs). A crash is
an internal error, an exception, a DPL000 on a program `ast.parse` accepts, or a file slower than the
limit; its program is saved to the crashes folder with what went wrong.
"""

from __future__ import annotations

import argparse
import importlib.util
import multiprocessing
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import List, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent
HANG_SECONDS = 60  # a file still linting after this long is reported as a hang, and the run goes on
PATHOLOGICAL_LIMIT_SECONDS = 5.0  # no file may take longer (issue 21)


def load_generator():
    spec = importlib.util.spec_from_file_location("dplint_fuzz_generator", ROOT / "tests" / "test_fuzz.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


class Hang(Exception):
    pass


def _on_alarm(signum, frame):
    raise Hang(f"still linting after {HANG_SECONDS} s")


def problem_with(fuzz, program: str) -> Tuple[Optional[str], float]:
    """What went wrong linting `program` (None when nothing did), and the seconds it took."""
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(HANG_SECONDS)
    start = time.perf_counter()
    try:
        result, seconds = fuzz.lint_timed(program)
    except BaseException as error:  # noqa: B036 -- a crash of any kind is what this run looks for
        if isinstance(error, KeyboardInterrupt):
            raise
        return f"exception:\n{traceback.format_exc()}", time.perf_counter() - start
    finally:
        signal.alarm(0)
    if result.internal_errors:
        error = result.internal_errors[0]
        return f"internal error in rule {error.code}:\n{error.details}", seconds
    unparsed = [f.message for f in result.findings if f.code == "DPL000"]
    if unparsed:
        return f"DPL000 on a valid program: {unparsed[0]}", seconds
    if seconds > fuzz.SLOWEST_GENERATED_FILE_SECONDS:
        # On a shared machine one run can stall (another process, a GC pass): slow means slow twice more.
        again = min(fuzz.lint_timed(program)[1] for _ in range(2))
        if again > fuzz.SLOWEST_GENERATED_FILE_SECONDS:
            return f"slow: {seconds:.2f} s, then {again:.2f} s (the limit is {fuzz.SLOWEST_GENERATED_FILE_SECONDS} s)", seconds
        return None, again
    return None, seconds


def run_share(task: Tuple[int, int, int, str]) -> Tuple[int, float, List[str]]:
    """One worker's share: `count` programs from seed `seed`; (programs linted, slowest seconds, crash files)."""
    worker, count, seed, crashes = task
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))  # as the CLI's workers run
    import hypothesmith
    from hypothesis import given, seed as with_seed, settings

    fuzz = load_generator()
    linted, slowest, saved = 0, 0.0, []  # slowest: after re-timing a stalled run

    @with_seed(seed)
    @settings(max_examples=count, deadline=None, database=None, suppress_health_check=fuzz.FUZZ["suppress_health_check"])
    @given(fuzz.programs(hypothesmith.from_grammar() | hypothesmith.from_node()))
    def lint_one(program: str) -> None:
        nonlocal linted, slowest
        problem, seconds = problem_with(fuzz, program)
        linted += 1
        slowest = max(slowest, seconds)
        if problem is not None:
            path = Path(crashes) / f"crash-{seed}-{linted}.py"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(program, encoding="utf-8")
            path.with_suffix(".txt").write_text(problem, encoding="utf-8")
            saved.append(str(path))
            print(f"worker {worker}: CRASH saved to {path}: {problem.splitlines()[0]}", file=sys.stderr, flush=True)
        if linted % 250 == 0:
            print(f"worker {worker}: {linted}/{count} programs, slowest {slowest:.2f} s", file=sys.stderr, flush=True)

    lint_one()
    return linted, slowest, saved


def time_pathological() -> int:
    """Lint each pathological file of tests/test_fuzz.py (with its trigger, as the test does) and the
    issue-21 shapes at full size; the slowest of two runs is the figure, each file's own process state aside."""
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    fuzz = load_generator()
    files = {name: source + "\n" + fuzz.TRIGGER for name, source in fuzz.PATHOLOGICAL.items()}
    files.update(fuzz.PATHOLOGICAL_AT_SCALE)
    slow = []
    for name, source in files.items():
        result, seconds = fuzz.lint_timed(source)
        seconds = max(seconds, fuzz.lint_timed(source)[1])
        codes = sorted({finding.code for finding in result.findings})
        print(f"{seconds:6.2f} s  {name} ({source.count(chr(10)):,} lines): {', '.join(codes) or 'no findings'}", flush=True)
        if seconds > PATHOLOGICAL_LIMIT_SECONDS or result.internal_errors:
            slow.append(name)
    print(f"over {PATHOLOGICAL_LIMIT_SECONDS} s or with an internal error: {', '.join(slow) or 'none'}")
    return 1 if slow else 0


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10_000, help="programs to generate and lint (default: 10,000)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first worker; worker i uses seed + i (default: 0)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes (default: one per core)")
    parser.add_argument("--crashes", default=str(ROOT / "bench" / "fuzz-crashes"), help="folder for crashing programs")
    parser.add_argument("--pathological", action="store_true", help="time the pathological files instead of fuzzing")
    args = parser.parse_args(argv)
    if args.pathological:
        return time_pathological()

    jobs = max(1, min(args.jobs, args.count))
    shares = [args.count // jobs + (1 if i < args.count % jobs else 0) for i in range(jobs)]
    tasks = [(i, share, args.seed + i, args.crashes) for i, share in enumerate(shares)]
    start = time.perf_counter()
    if jobs == 1:
        results = [run_share(tasks[0])]
    else:
        with multiprocessing.get_context("spawn").Pool(jobs) as pool:
            results = pool.map(run_share, tasks, chunksize=1)
    wall = time.perf_counter() - start

    linted = sum(count for count, _, _ in results)
    crashes = [path for _, _, saved in results for path in saved]
    print(f"programs linted: {linted} (asked {args.count}, seed {args.seed}, {jobs} worker(s))")
    print(f"wall time: {wall:.1f} s ({wall / max(linted, 1) * 1000:.0f} ms per program, generation included)")
    print(f"slowest file: {max(slowest for _, slowest, _ in results):.2f} s")
    print(f"crashes: {len(crashes)}")
    for path in crashes:
        print(f"  {path}: {Path(path).with_suffix('.txt').read_text(encoding='utf-8').splitlines()[0]}")
    return 1 if crashes else 0


if __name__ == "__main__":
    sys.exit(main())
