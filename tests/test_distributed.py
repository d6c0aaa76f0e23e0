"""dplint.runtime.distributed: real gloo process groups on CPU, through launch(), `dplint run` and the pytest marker.

Every launch sets a timeout of a few seconds; the functions the ranks run are defined at module level
so that the ranks can import them.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from dplint.finding import Finding
from dplint.runtime.distributed import LaunchError, launch
from dplint.runtime.distributed.analysis import findings as analyse
from dplint.finding import display_path
from dplint.run_cli import main as run_main

PROGRAMS = Path(__file__).parent / "distributed_programs"
PROJECT = PROGRAMS / "project"
TIMEOUT = 15  # every wait on a peer, the rendezvous included: room for a loaded 2-core machine
SOURCE = Path(__file__).read_text()


def line_of(marker: str) -> str:
    """`path:N` of the line carrying `# <marker>`, the path as dplint shows it (relative to the working folder)."""
    for number, line in enumerate(SOURCE.splitlines(), 1):
        if line.rstrip().endswith(f"# {marker}"):
            return f"{display_path(__file__)}:{number}"
    raise AssertionError(marker)


def line_in(program: Path, text: str) -> str:
    """`path:N` of the first line of a program holding `text`."""
    number = next(n for n, line in enumerate(program.read_text().splitlines(), 1) if text in line)
    return f"{program}:{number}"


def spot_in(program: Path, text: str, expression: Optional[str] = None) -> str:
    """`path:N:C` of the first line of a program holding `text`, C where `expression` (default: `text`) starts
    on it: a runtime finding's place is the start of the call it is about, as a static finding's is."""
    number, line = next((n, line) for n, line in enumerate(program.read_text().splitlines(), 1) if text in line)
    return f"{program}:{number}:{line.index(expression or text) + 1}"


def spot_of(marker: str, expression: str) -> str:
    """`path:N:C` of the line of this file carrying `# <marker>`, C where `expression` starts on it."""
    place = line_of(marker)
    number = int(place.rsplit(":", 1)[1])
    return f"{place}:{SOURCE.splitlines()[number - 1].index(expression) + 1}"


def place(finding: Finding) -> str:
    return f"{finding.path}:{finding.location.row}"


@pytest.fixture(autouse=True)
def no_leaked_ranks() -> Any:
    yield
    assert multiprocessing.active_children() == []


# what the ranks run ------------------------------------------------------------------------------
def environment_and_sum(offset: int) -> Dict[str, Any]:
    total = torch.tensor([float(dist.get_rank() + offset)])
    dist.all_reduce(total)
    names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    return {"env": {name: os.environ[name] for name in names}, "sum": total.item(), "cuda": torch.cuda.is_available()}


def dataset() -> TensorDataset:
    generator = torch.Generator().manual_seed(7)
    inputs = torch.randn(32, 4, generator=generator)
    return TensorDataset(inputs, (inputs.sum(dim=1) > 0).long())


def train(pitfalls: Sequence[str], folder: Path) -> List[torch.Tensor]:
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)))
    data = dataset()
    seed = rank if "seed_per_rank" in pitfalls else 0
    sampler = DistributedSampler(data, shuffle=True, seed=seed)  # sampler
    if "unsharded" in pitfalls:
        loader = DataLoader(data, batch_size=4, shuffle=True)  # unsharded loader
    else:
        loader = DataLoader(data, batch_size=4, sampler=sampler)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if "load_on_rank_zero" in pitfalls and rank == 0:
        model.module.load_state_dict({k: v + 1 for k, v in model.module.state_dict().items()})  # load after wrap
    for epoch in range(2):
        if "no_set_epoch" not in pitfalls:
            sampler.set_epoch(epoch)
        next(iter(loader))  # a peek at one batch is not an epoch
        for inputs, targets in loader:
            optimizer.zero_grad()
            outputs = model.module(inputs) if "module_forward" in pitfalls else model(inputs)  # module forward
            nn.functional.cross_entropy(outputs, targets).backward()
            optimizer.step()
    model.eval()
    with torch.no_grad():  # every rank evaluating the whole set, through .module, is fine
        for inputs, _ in DataLoader(data, batch_size=8):
            model.module(inputs)
    if rank == 0 or "save_every_rank" in pitfalls:
        torch.save(model.module.state_dict(), folder / "model.pt")  # save
    return [p.detach() for p in model.parameters()]


def unused_parameter() -> None:
    class TwoHeads(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.used = nn.Linear(2, 2)
            self.unused = nn.Linear(2, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.used(x)

    model = DDP(TwoHeads())  # unused parameters
    for _ in range(2):
        model(torch.ones(1, 2)).sum().backward()


def noise_outside_the_optimizer() -> None:
    torch.manual_seed(dist.get_rank())  # a seed per rank: each rank draws its own noise
    net = nn.Linear(4, 2)
    model = DDP(net)  # replicas diverge
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        optimizer.zero_grad()
        model(torch.ones(8, 4)).sum().backward()
        optimizer.step()
        for parameter in net.parameters():  # a per-rank update outside DDP's gradient sync
            parameter.data.add_(torch.randn_like(parameter) * 1e-3)


def failing_rank() -> None:
    if dist.get_rank() == 1:
        raise ValueError("no such shard")  # rank 1 fails
    dist.barrier()


def hanging_barrier() -> None:
    if dist.get_rank() == 0:
        dist.barrier()  # rank 0 waits
    else:
        time.sleep(60)


def gathered_objects() -> List[Any]:
    objects: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(objects, {"rank": dist.get_rank()})
    return objects


# launch() ----------------------------------------------------------------------------------------
def test_launch_returns_each_ranks_result_under_torchrun_environment() -> None:
    results = launch(environment_and_sum, 10, nprocs=2, timeout=TIMEOUT)
    assert [r["sum"] for r in results] == [21.0, 21.0]
    assert [r["env"]["RANK"] for r in results] == ["0", "1"]
    assert [r["env"]["LOCAL_RANK"] for r in results] == ["0", "1"]
    assert {r["env"]["WORLD_SIZE"] for r in results} == {"2"} == {r["env"]["LOCAL_WORLD_SIZE"] for r in results}
    assert len({(r["env"]["MASTER_ADDR"], r["env"]["MASTER_PORT"]) for r in results}) == 1
    assert not any(r["cuda"] for r in results)


def test_collectives_made_of_collectives_are_fingerprinted_once() -> None:
    assert launch(gathered_objects, nprocs=3, timeout=TIMEOUT) == [[{"rank": 0}, {"rank": 1}, {"rank": 2}]] * 3


def test_correct_training_has_no_findings_and_identical_replicas(tmp_path: Path) -> None:
    rank0, rank1 = launch(train, (), tmp_path, nprocs=2, timeout=TIMEOUT)
    assert all(torch.equal(a, b) for a, b in zip(rank0, rank1))
    assert (tmp_path / "model.pt").exists()


def test_training_pitfalls_are_each_found_where_they_are(tmp_path: Path) -> None:
    with pytest.raises(LaunchError) as caught:
        launch(train, ("no_set_epoch", "module_forward", "save_every_rank"), tmp_path, nprocs=2, timeout=TIMEOUT)
    assert caught.value.failure is None
    found = {finding.code: finding for finding in caught.value.findings}
    assert sorted(found) == ["DPL501", "DPL504", "DPL505"]
    assert place(found["DPL501"]) == line_of("sampler")
    assert "epoch still 0" in found["DPL501"].message
    assert place(found["DPL504"]) == line_of("module forward")
    assert "`0.weight`" in found["DPL504"].message
    assert place(found["DPL505"]) == line_of("save") and found["DPL505"].ranks == (0, 1)


def save_checkpoint(model: nn.Module, path: Path) -> None:
    write_checkpoint(model.state_dict(), path)


def write_checkpoint(state: Dict[str, Any], path: Path) -> None:
    torch.save(state, path)  # inside the helpers


def train_one_model(folder: Path) -> None:
    model = nn.Linear(2, 2)
    save_checkpoint(model, folder / "helper.pt")  # unguarded call of the helper


def test_dpl505_points_at_the_unguarded_call_of_a_save_helper(tmp_path: Path) -> None:
    with pytest.raises(LaunchError) as caught:
        launch(train_one_model, tmp_path, nprocs=2, timeout=TIMEOUT)
    [finding] = caught.value.findings
    assert finding.code == "DPL505" and place(finding) == line_of("unguarded call of the helper")


def test_warn_action_returns_results_and_warns(tmp_path: Path) -> None:
    with pytest.warns(RuntimeWarning, match="DPL505"):
        results = launch(train, ("save_every_rank",), tmp_path, nprocs=2, timeout=TIMEOUT, action="warn")
    assert len(results) == 2


@pytest.mark.parametrize(
    ("pitfall", "code", "where", "words"),
    [
        ("unsharded", "DPL503", "unsharded loader", "the same first batch"),
        ("seed_per_rank", "DPL513", "sampler", "seed differs between ranks (0 on rank 0, 1 on rank 1)"),
    ],
)
def test_unsharded_or_inconsistent_samplers_are_found(tmp_path: Path, pitfall: str, code: str, where: str, words: str) -> None:
    with pytest.raises(LaunchError) as caught:
        launch(train, (pitfall,), tmp_path, nprocs=2, timeout=TIMEOUT)
    [finding] = [f for f in caught.value.findings if f.code == code]
    assert place(finding) == line_of(where) and words in finding.message


def test_parameters_changed_on_one_rank_after_wrapping_are_named_as_the_cause(tmp_path: Path) -> None:
    with pytest.raises(LaunchError) as caught:
        launch(train, ("load_on_rank_zero",), tmp_path, nprocs=2, timeout=TIMEOUT)
    [finding] = caught.value.findings
    assert finding.code == "DPL511" and place(finding) == line_of("load after wrap")
    assert "`load_state_dict()` runs on rank 0 only after the DDP wrap: ranks keep different weights" in finding.message
    assert "after optimizer step 1" in finding.message


def test_unused_parameters_are_named() -> None:
    with pytest.raises(LaunchError) as caught:
        launch(unused_parameter, nprocs=2, timeout=TIMEOUT)
    failure = caught.value.failure
    assert failure is not None and failure.code == "DPL521" and failure.where == spot_of("unused parameters", "DDP(")
    assert "`unused.weight`, `unused.bias`" in failure.message and "find_unused_parameters=True" in failure.message


def test_parameters_changed_outside_ddp_are_found_at_the_wrap() -> None:
    # DPL520's example: no forward through `.module`, no change after the wrap that DDP sees; the replicas still differ.
    with pytest.raises(LaunchError) as caught:
        launch(noise_outside_the_optimizer, nprocs=2, timeout=TIMEOUT)
    [finding] = caught.value.findings
    assert finding.code == "DPL520" and f"{finding.path}:{finding.location.row}:{finding.location.column}" == spot_of("replicas diverge", "DDP(")
    assert finding.message.startswith("`weight`, `bias` differ between the replicas after optimizer step 2: ")


def test_a_failed_rank_is_reported_with_what_the_others_were_doing() -> None:
    with pytest.raises(LaunchError) as caught:
        launch(failing_rank, nprocs=2, timeout=TIMEOUT)
    error = caught.value
    assert error.failure is not None and error.failure.rank == 1
    assert error.failure.where == line_of("rank 1 fails")
    assert str(error).splitlines()[0] == f"rank 1 failed at {line_of('rank 1 fails')}: ValueError: no such shard"
    assert "rank 0 " in str(error) and "dist.barrier()" in str(error)


def test_a_hang_becomes_an_error_naming_both_ranks_within_the_timeout() -> None:
    started = time.monotonic()
    with pytest.raises(LaunchError) as caught:
        launch(hanging_barrier, nprocs=2, timeout=2)
    assert time.monotonic() - started < 15
    message = str(caught.value)
    assert caught.value.code == "DPL507"
    assert f"rank 0 is in dist.barrier() at {line_of('rank 0 waits')}" in message
    assert "rank 1 is running hanging_barrier() and has made no collective yet" in message


def live_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def destroy_group_then_free_the_model() -> Tuple[int, int]:
    model = DDP(nn.Linear(2, 2))
    model(torch.ones(1, 2)).sum().backward()
    dist.destroy_process_group()
    before = live_threads()
    del model  # the reducer held the last reference to the gloo group
    return before, live_threads()


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_a_destroyed_group_outlives_the_model_that_held_it() -> None:
    # Freed with the model, the group would join its gloo threads while the GIL is held, and a thread
    # waiting for the GIL to free a finished collective's tensors hung the rank (pytorch/pytorch#56297).
    for before, after in launch(destroy_group_then_free_the_model, timeout=TIMEOUT, checks=[]):
        assert after == before


def test_bad_arguments_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="nprocs"):
        launch(environment_and_sum, 0, nprocs=0)
    with pytest.raises(ValueError, match="unknown checks"):
        launch(environment_and_sum, 0, checks=["telepathy"])


# the comparisons made after the run ----------------------------------------------------------------
def batch(indices: List[int], padding: int = 0) -> Dict[str, Any]:
    return {"kind": "batch", "index": 0, "where": "t.py:1", "padding": padding, "indices": indices}


def test_first_batches_that_overlap_only_by_the_samplers_padding_are_fine() -> None:
    assert analyse({0: [batch([0, 1, 2], padding=1)], 1: [batch([2, 3, 4], padding=1)]}) == []
    [finding] = analyse({0: [batch([0, 1, 2])], 1: [batch([2, 3, 4])]})
    assert finding.code == "DPL503" and "share 1" in finding.message
    assert analyse({0: [batch([0, 1])], 1: [batch([2, 3])]}) == []


def test_a_rank_alone_is_never_compared() -> None:
    assert analyse({0: [batch([0, 1])]}) == []


# dplint run --------------------------------------------------------------------------------------
def dplint_run(*arguments: str, cwd: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "dplint", "run", "--timeout", str(TIMEOUT), *arguments]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=120)


def test_dplint_run_finds_the_runtime_pitfalls_of_a_multi_file_torchrun_project(tmp_path: Path) -> None:
    script = PROJECT / "train_pitfalls.py"
    result = dplint_run("--nproc-per-node", "2", str(script), "--epochs", "2", "--checkpoint", "ckpt.pt", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split(": ", 1)[1].split()[0] for line in lines] == ["DPL501", "DPL504", "DPL505"]
    assert lines[0].startswith(f"{PROJECT / 'data.py'}:13:15: DPL501")
    assert lines[2].startswith(f"{script}:36:5: DPL505") and "`ckpt.pt`" in lines[2]
    assert result.stderr.count("backend 'nccl' runs as 'gloo' on CPU") == 1


def test_dplint_run_runs_the_corrected_project_to_the_end_with_no_findings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    # In-process, with this session's warm ranks; the divergence check compared the replicas after every step.
    monkeypatch.chdir(tmp_path)
    assert run_main(["--timeout", str(TIMEOUT), str(PROJECT / "train.py"), "--checkpoint", "ckpt.pt"]) == 0
    assert capsys.readouterr().err == "dplint run: 2 ranks finished; no distributed pitfalls found\n"
    assert (tmp_path / "ckpt.pt").exists()


FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def static_findings(project: Path) -> Dict[Tuple[str, str], str]:
    """The message of each finding in the project's expected-output files, by (`file:line:column`, code)."""
    found = {}
    for expected in project.glob("*.txt"):
        for line in expected.read_text().splitlines():
            location, code, message = line.split(" ", 2)
            path, row, column = location.split(":")[:3]
            found[(f"{Path(path).name}:{row}:{column}", code)] = message
    return found


def test_dplint_run_on_the_ddp_fixture_confirms_its_static_findings_and_the_fixed_twin_is_clean(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    # The static rules' fixture project runs as written under `dplint run`; the ranks show the same pitfalls.
    monkeypatch.chdir(FIXTURES / "ddp_project")
    assert run_main(["--timeout", str(TIMEOUT), "train.py", "--epochs", "2", "--out-dir", str(tmp_path)]) == 1
    runtime = [line.split(": ", 1) for line in capsys.readouterr().out.splitlines()]
    assert [(spot, said.split()[0]) for spot, said in runtime] == [
        ("data.py:25:21", "DPL501"),
        ("data.py:25:56", "DPL513"),
        ("data.py:27:20", "DPL503"),
        ("replay.py:11:12", "DPL503"),
        ("engine.py:25:26", "DPL504"),
        ("train.py:68:9", "DPL505"),
        ("engine.py:13:26", "DPL508"),  # `torch.device("cuda")` without set_device: GPU 0 on every rank
    ]
    monkeypatch.chdir(FIXTURES / "ddp_project_fixed")
    assert run_main(["--timeout", str(TIMEOUT), "train.py", "--epochs", "2", "--out-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().err.endswith("dplint run: 2 ranks finished; no distributed pitfalls found\n")
    assert not static_findings(FIXTURES / "ddp_project_fixed")


# What a runtime finding and the static finding of the same code both say.
SAID_ALIKE = {
    "DPL501": "every epoch has the same order",
    "DPL503": "every DDP rank iterates the same data",
    "DPL504": "gradients are not averaged",
    "DPL505": "the writes race and can corrupt the file",
    "DPL512": "`dist.all_reduce` works in place and returns `None` here",
    "DPL513": "ranks shuffle differently and overlap",
}


@pytest.mark.parametrize(
    ("arguments", "confirmed"),
    [
        (["--epochs", "2"], [("data.py:25:21", "DPL501"), ("data.py:25:56", "DPL513"), ("replay.py:11:12", "DPL503"),
                             ("engine.py:25:26", "DPL504"), ("train.py:68:9", "DPL505")]),
        (["--epochs", "1", "--eval-on-rank0"], [("train.py:67:17", "DPL507")]),
        (["--epochs", "1", "--log-global-loss"], [("dist_utils.py:19:13", "DPL512")]),
    ],
    ids=["two-epochs", "rank-0-barrier", "collective-result"],
)  # fmt: skip
def test_the_ranks_report_a_static_finding_at_its_place_and_in_its_words(
    arguments: List[str], confirmed: List[Tuple[str, str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    # The start of the same expression, and a sentence as the static rule writes it: capitalised, its consequence alike.
    import json

    monkeypatch.chdir(FIXTURES / "ddp_project")
    assert run_main(["--timeout", str(TIMEOUT), "--format", "json", "train.py", "--out-dir", str(tmp_path), *arguments]) == 1
    runtime = {(f"{f['filename'].rsplit('/', 1)[1]}:{f['location']['row']}:{f['location']['column']}", f["code"]): f["message"]
               for f in json.loads(capsys.readouterr().out)}  # fmt: skip
    static = static_findings(FIXTURES / "ddp_project")
    for place in confirmed:
        assert place in runtime and place in static, (place, sorted(runtime))
        message = runtime[place]
        assert message[:1] in "`" or message[:1].isupper(), message
        assert message.endswith("."), message
        alike = SAID_ALIKE.get(place[1])
        assert alike is None or (alike in message and alike in static[place]), (message, static[place])


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ([], "the following arguments are required"),
        (["missing.py"], "no such script: missing.py"),
        (["--nnodes", "1:4", "x.py"], "--nnodes 1:4 is an elastic range; dplint emulates a fixed number of nodes: give one (--nnodes 4)"),
        (["--nnodes", "two", "x.py"], "--nnodes takes a number of nodes, got two"),
        (["--nnodes", "0", "x.py"], "--nnodes must be at least 1, got 0"),
        (["--devices", "2", "--nnodes", "2", "x.py"], "--devices runs one process with N GPUs: it takes no"),
        (["--checks", "samplers,telepathy", "x.py"], "unknown checks telepathy"),
        (["--checks", "", "x.py"], "--checks names no check"),
        (["--gpus-per-node", "-1", "x.py"], "--gpus-per-node must be 0 or more"),
    ],
)
def test_dplint_run_usage_errors(arguments: List[str], message: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit:
        run_main(arguments)
    assert exit.value.code == 2 and message in capsys.readouterr().err


# the pytest marker -------------------------------------------------------------------------------
def test_marked_test_fails_on_a_rank_conditional_barrier_naming_both_call_sites(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_sync="""
        import pytest, torch, torch.distributed as dist

        @pytest.mark.dplint(ranks=2, timeout=5)
        def test_sync():
            if dist.get_rank() == 0:
                dist.barrier()
            dist.all_reduce(torch.ones(3))
        """
    )
    started = time.monotonic()
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:asyncio")
    assert time.monotonic() - started < 30
    result.assert_outcomes(failed=1)
    assert (
        "DPL507 Collective mismatch: rank 0 is in dist.barrier() at test_sync.py:6; "
        "rank 1 is in dist.all_reduce(float32[3]) at test_sync.py:7."
    ) in result.stdout.str()


def test_a_marked_tests_failure_headline_is_its_finding_at_the_tests_own_line(pytester: pytest.Pytester) -> None:
    # A test whose name says "save" is not a save helper: its caller is pytest's machinery, not where a guard goes.
    pytester.makepyfile(
        test_checkpoint="""
        import pytest, torch

        @pytest.mark.dplint(ranks=2, timeout=5)
        def test_save_checkpoint(tmp_path):
            torch.save({"step": 1}, tmp_path / "last.pt")
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:asyncio", "-rf")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*_ test_save_checkpoint _*",
        "test_checkpoint.py:5: DPL505 Ranks 0 and 1 all save `last.pt` here: the writes race and can corrupt the file.",
        "*short test summary info*",
        "FAILED test_checkpoint.py::test_save_checkpoint - Failed: test_checkpoint.py:*",
    ])  # fmt: skip


def test_marker_default_ranks_and_fixtures(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_ranks="""
        import threading, pytest, torch, torch.distributed as dist

        @pytest.mark.dplint(ranks=True, timeout=5)
        def test_world(tmp_path):
            assert dist.get_world_size() == 3
            (tmp_path / f"rank{dist.get_rank()}").write_text("here")

        def test_shared_folder(tmp_path_factory):
            assert sorted(p.name for p in tmp_path_factory.getbasetemp().glob("test_world0/rank*")) == ["rank0", "rank1", "rank2"]

        @pytest.fixture
        def lock():
            return threading.Lock()

        @pytest.mark.dplint(ranks=2)
        def test_lock(lock):
            pass
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:asyncio", "--dplint-ranks", "3")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*fixture lock cannot be sent to the ranks (not picklable)*"])


def test_dplint_run_help_lists_each_check_whole_on_its_own_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setenv("COLUMNS", "60")
    with pytest.raises(SystemExit):
        run_main(["--help"])
    lines = capsys.readouterr().out.splitlines()
    from dplint.runtime.distributed import ALL_CHECKS

    assert [line.split()[0] for line in lines if line.startswith("  ") and line.split()[0] in ALL_CHECKS] == list(ALL_CHECKS)


@pytest.mark.parametrize("arguments", [["--help"], ["--checks", "telepathy", "x.py"]], ids=["help", "usage-error"])
def test_dplint_run_reads_its_command_line_without_importing_torch(arguments: List[str]) -> None:
    # torch takes seconds to import: only a run that starts needs it.
    probe = (
        "import sys, dplint.cli\n"
        "try:\n    dplint.cli.main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    result = subprocess.run([sys.executable, "-c", probe, "run", *arguments], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


# ranks that have children, threads, interruption ------------------------------------------------------
@pytest.mark.parametrize(("threads", "workers", "seen"), [(None, "2", "1"), ("3", "0", "3")], ids=["torchrun's", "the user's"])
def test_dplint_run_ranks_may_start_dataloader_workers_and_get_torchruns_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, threads: Optional[str], workers: str, seen: str
) -> None:
    # A subprocess: what the ranks print goes to the command's output, which the test reads.
    if threads is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # torchrun sets 1 for several ranks
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", threads)
    result = dplint_run(str(PROGRAMS / "loader_workers.py"), "--workers", workers, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == [f"rank 0 threads {seen}", f"rank 1 threads {seen}"]
    assert result.stderr == "dplint run: 2 ranks finished; no distributed pitfalls found\n"


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads process states from /proc")
@pytest.mark.parametrize(("sent", "group", "status", "said", "found"), [
    (signal.SIGINT, False, 130, "dplint run: interrupted; the ranks were stopped; no findings so far\n", False),
    # `timeout`, a scheduler: the launcher's whole group, dplint's forkserver with it; the findings so far are reported.
    (signal.SIGTERM, True, 143, "dplint run: stopped by signal 15; the ranks were stopped; 1 finding so far\n", True),
    (signal.SIGKILL, False, -signal.SIGKILL, "", False),  # no cleanup of its own: the ranks watch for the launcher's end
], ids=["ctrl-c", "group-terminated", "killed"])  # fmt: skip
def test_when_the_launcher_ends_every_rank_and_its_workers_end(
    tmp_path: Path, sent: int, group: bool, status: int, said: str, found: bool
) -> None:
    script = PROGRAMS / "slow_loader.py"
    command = [sys.executable, "-m", "dplint", "run", "--timeout", "60", str(script), str(tmp_path), *(["gpu0"] if found else [])]
    # A shell's background job ignores SIGINT, and Python keeps an ignored SIGINT ignored: Ctrl-C as from a terminal.
    launcher = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("*-*"))) < 6 and time.monotonic() < deadline:  # 2 ranks, 2 workers each
        time.sleep(0.1)
    pids = [int(path.read_text()) for path in tmp_path.glob("*-*")]
    assert len(pids) == 6 and all(map(alive, pids))
    if group:
        os.killpg(launcher.pid, sent)
    else:
        launcher.send_signal(sent)
    out, err = launcher.communicate(timeout=30)
    assert launcher.returncode == status
    assert err.endswith(said) and "Traceback" not in err  # dplint's notes aside, nothing but the last line
    found_line = f"{spot_in(script, '.cuda(0)', 'torch.zeros')}: DPL508 Ranks 0 and 1 all put this tensor on `cuda:0`: they share one GPU.\n"
    assert out == (found_line if found else "")
    deadline = time.monotonic() + 10  # killed at once; the kernel may take a moment to reap the orphaned workers
    while any(map(alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(map(alive, pids))


def test_torchruns_rendezvous_flags_are_accepted_and_said_to_be_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    flags = ["--nnodes=1", "--rdzv_id=101", "--rdzv-endpoint=localhost:5972", "--master_port", "29500"]
    assert run_main([*flags, "--timeout", str(TIMEOUT), str(PROGRAMS / "torchrun_tutorial.py")]) == 0
    err = capsys.readouterr().err
    assert "dplint: --rdzv-id, --rdzv-endpoint, --master-port ignored: the ranks of every node meet at dplint's own store, on this machine\n" in err


def test_without_torch_dplint_run_and_pytest_dplint_name_the_extra(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['torch'] = None  # `import torch` fails\n")
    (tmp_path / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    environment = {**os.environ, "PYTHONPATH": str(tmp_path)}
    for command, prefix in [
        (["-m", "dplint", "run", str(PROGRAMS / "loader_workers.py")], "dplint run: error: `dplint run` needs the runtime extra: "),
        (["-m", "pytest", "--dplint", "-p", "no:cacheprovider", "test_nothing.py"], "Exit: dplint: the runtime checks need the runtime extra: "),
    ]:
        result = subprocess.run([sys.executable, *command], cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=60)
        assert result.returncode == 2
        [line] = [line for line in (result.stdout + result.stderr).splitlines() if "extra" in line]
        assert line.startswith(prefix) and "pip install '.[runtime]'" in line
        assert "Traceback" not in result.stderr


# several nodes on one machine --------------------------------------------------------------------
MULTINODE = FIXTURES / "multinode"
TWO_NODES = ["--nnodes", "2", "--nproc-per-node", "2"]


def test_two_emulated_nodes_number_the_ranks_as_torchrun_does(tmp_path: Path) -> None:
    script = tmp_path / "environment.py"
    script.write_text(
        "import json, os, torch\nimport torch.distributed as dist\n\n"
        "dist.init_process_group('gloo')\n"
        "names = ('RANK', 'LOCAL_RANK', 'GROUP_RANK', 'WORLD_SIZE', 'LOCAL_WORLD_SIZE')\n"
        "seen = {name: int(os.environ[name]) for name in names}\n"
        "seen['gpus'] = torch.cuda.device_count()\n"
        "with open(f\"rank{os.environ['RANK']}.json\", 'w') as out:\n"
        "    json.dump(seen, out)\n"
    )
    result = dplint_run(*TWO_NODES, str(script), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr.endswith("dplint run: 4 ranks on 2 emulated nodes finished; no distributed pitfalls found\n")
    import json

    seen = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(4)]
    assert [(s["RANK"], s["LOCAL_RANK"], s["GROUP_RANK"]) for s in seen] == [(0, 0, 0), (1, 1, 0), (2, 0, 1), (3, 1, 1)]
    assert {(s["WORLD_SIZE"], s["LOCAL_WORLD_SIZE"], s["gpus"]) for s in seen} == {(4, 2, 2)}


def test_on_two_nodes_the_global_rank_as_a_device_fails_at_its_line_and_the_fixed_twin_runs_clean(tmp_path: Path) -> None:
    buggy = dplint_run(*TWO_NODES, str(MULTINODE / "train.py"), cwd=tmp_path)
    assert buggy.returncode == 1, buggy.stderr
    [line] = buggy.stdout.splitlines()
    place, message = line.split(": DPL516 ")
    assert place == spot_in(MULTINODE / "train.py", "torch.cuda.set_device(rank)")
    assert message in (
        "Rank 2 asks for `cuda:2`, its global rank, on a node of 2 GPUs: a GPU's index on its node is the local rank (0 here).",
        "Rank 3 asks for `cuda:3`, its global rank, on a node of 2 GPUs: a GPU's index on its node is the local rank (1 here).",
    )
    # The same script on one node: global and local ranks are equal, and it runs.
    assert dplint_run("--nproc-per-node", "2", str(MULTINODE / "train.py"), cwd=tmp_path).returncode == 0
    # Each node's ranks place onto that node's cuda:0 and cuda:1: no GPU is shared, nothing is reported.
    fixed = dplint_run(*TWO_NODES, str(FIXTURES / "multinode_fixed" / "train.py"), cwd=tmp_path)
    assert (fixed.returncode, fixed.stdout) == (0, ""), fixed.stderr


def test_one_writer_on_each_node_of_one_path_is_a_race_across_nodes(tmp_path: Path) -> None:
    script = tmp_path / "per_node_save.py"
    script.write_text(
        "import os, torch\nimport torch.distributed as dist\n\n"
        "dist.init_process_group('gloo')\n"
        "if int(os.environ['LOCAL_RANK']) == 0:\n"
        "    torch.save({'step': 1}, 'last.pt')\n"
    )
    result = dplint_run(*TWO_NODES, str(script), cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert result.stdout.splitlines() == [
        f"{spot_in(script, 'torch.save(').removeprefix(f'{tmp_path}/')}: DPL526 Ranks 0 and 2, one on each of 2 nodes, all save `last.pt` here: "
        "on a filesystem the nodes share, the writes race."
    ]
    assert dplint_run("--nproc-per-node", "2", str(script), cwd=tmp_path).returncode == 0  # one node: one writer


def test_on_two_nodes_a_group_joined_with_the_local_rank_as_its_rank_fails_saying_so(tmp_path: Path) -> None:
    script = tmp_path / "local_rank_group.py"
    script.write_text(
        "import os\nimport torch.distributed as dist\n\n"
        "local_rank = int(os.environ['LOCAL_RANK'])\n"
        "dist.init_process_group('gloo', rank=local_rank, world_size=int(os.environ['WORLD_SIZE']))\n"
    )
    result = dplint_run(*TWO_NODES, str(script), cwd=tmp_path)
    assert result.returncode == 1
    place = line_in(script, "init_process_group(").removeprefix(f"{tmp_path}/")
    # The first rank of the second node to get there: rank 2 (local rank 0) or rank 3 (local rank 1).
    said = re.fullmatch(rf"{re.escape(place)}:1: DPL519 Rank (\d) passes its local rank (\d) as `rank=`: the nodes' processes claim the same global ranks\.", result.stdout.strip())
    assert said is not None and int(said.group(1)) == int(said.group(2)) + 2, result.stdout
    # The static rule reports the same line.
    static = subprocess.run(
        [sys.executable, "-m", "dplint", "--preview", "--select", "DPL519", "--format", "concise", "--no-cache", script.name],
        cwd=tmp_path, capture_output=True, text=True,
    )  # fmt: skip
    assert static.stdout.startswith(f"{place}:") and " DPL519 " in static.stdout


def test_a_spawning_script_on_two_nodes_spawns_its_nodes_ranks(tmp_path: Path) -> None:
    script = tmp_path / "spawner.py"
    script.write_text(
        "import os, torch\nimport torch.distributed as dist\nimport torch.multiprocessing as mp\n\n"
        "def worker(gpu, nodes):\n"
        "    rank = int(os.environ['GROUP_RANK']) * torch.cuda.device_count() + gpu\n"
        "    dist.init_process_group('gloo', rank=rank, world_size=nodes * torch.cuda.device_count())\n"
        "    torch.cuda.set_device(gpu)\n\n"
        "if __name__ == '__main__':\n"
        "    mp.spawn(worker, args=(2,), nprocs=torch.cuda.device_count())\n"
    )
    result = dplint_run(*TWO_NODES, str(script), cwd=tmp_path)
    assert result.returncode == 0, result.stderr


# the frameworks, unmodified -----------------------------------------------------------------------
def test_an_accelerate_script_runs_on_cpu_ranks_and_its_main_process_barrier_stops_at_the_scripts_line(tmp_path: Path) -> None:
    script = FIXTURES / "accelerate" / "train.py"
    buggy = dplint_run(str(script), "--out", str(tmp_path / "model.pt"), cwd=tmp_path)
    assert buggy.returncode == 1, buggy.stderr
    place = spot_in(script, "accelerator.wait_for_everyone()")
    loader = spot_in(script, "torch.utils.data.DataLoader(")
    # The barrier, and the loader the script never prepares: every rank gets the same first batch.
    [unsharded, line] = sorted(buggy.stdout.splitlines(), key=lambda line: line.split(": ", 1)[1])
    assert line.startswith(f"{place}: DPL507 Collective mismatch: rank 0 is in dist.barrier() at {place.rsplit(':', 1)[0]};")
    assert unsharded.startswith(f"{loader}: DPL503 ")
    # The static rules report the same calls (the fixture's expected output, which tests/test_fixtures.py checks),
    # and the evaluation's `accelerator.gather`, which keeps the samples the prepared loader repeats.
    gather = spot_in(script, "accelerator.gather(")
    assert sorted(static_findings(FIXTURES / "accelerate")) == [
        (f"train.py:{loader.split(':', 1)[1]}", "DPL503"),
        (f"train.py:{place.split(':', 1)[1]}", "DPL507"),
        (f"train.py:{gather.split(':', 1)[1]}", "DPL522"),
    ]
    fixed = dplint_run(str(FIXTURES / "accelerate_fixed" / "train.py"), "--out", str(tmp_path / "model.pt"), cwd=tmp_path)
    assert fixed.returncode == 0, fixed.stderr
    # No finding; the main process's evaluation line counts each sample once (`gather` would count 24).
    assert re.fullmatch(r"validation error \d+\.\d+ over 21 of 21 samples\n", fixed.stdout), fixed.stdout
    assert (tmp_path / "model.pt").exists()


def test_a_lightning_script_for_two_gpus_runs_on_cpu_ranks_and_its_rank_zero_checkpoint_stops_at_the_scripts_line(tmp_path: Path) -> None:
    # `Trainer(accelerator="gpu", devices=2, strategy="ddp")` as written: Lightning finds torchrun's
    # environment, starts no processes of its own, and runs on the emulated GPUs.
    script = FIXTURES / "lightning" / "train.py"
    buggy = dplint_run("--nproc-per-node", "2", str(script), "--out", str(tmp_path / "last.ckpt"), cwd=tmp_path)
    assert buggy.returncode == 1, buggy.stderr
    [line] = buggy.stdout.splitlines()
    place = spot_in(script, "trainer.save_checkpoint(args.out)")
    assert line.startswith(f"{place}: DPL507 Collective mismatch: rank 0 is in dist.barrier() at {place.rsplit(':', 1)[0]};")
    logged = spot_in(script, 'self.log("val_loss"')
    assert sorted(static_findings(FIXTURES / "lightning")) == [
        (f"train.py:{logged.split(':', 1)[1]}", "DPL523"),
        (f"train.py:{place.split(':', 1)[1]}", "DPL507"),
    ]
    fixed = dplint_run("--nproc-per-node", "2", str(FIXTURES / "lightning_fixed" / "train.py"), "--out", str(tmp_path / "last.ckpt"), cwd=tmp_path)
    assert (fixed.returncode, fixed.stdout) == (0, ""), fixed.stderr
    assert (tmp_path / "last.ckpt").exists()


def test_a_deepspeed_script_runs_on_cpu_ranks_and_its_rank_zero_checkpoint_stops_at_the_scripts_line(tmp_path: Path) -> None:
    # DeepSpeed runs its CPU accelerator under `dplint run`; `engine.save_checkpoint` meets in a barrier.
    script = FIXTURES / "deepspeed" / "train.py"
    buggy = dplint_run("--nproc-per-node", "2", str(script), "--out", str(tmp_path / "ckpt"), cwd=tmp_path)
    assert buggy.returncode == 1, buggy.stderr
    place = spot_in(script, "engine.save_checkpoint(args.out)")
    [line] = [line for line in buggy.stdout.splitlines() if "DPL" in line]  # DeepSpeed prints what it builds
    assert line.startswith(f"{place}: DPL507 Collective mismatch: rank 0 is in dist.barrier() at {place.rsplit(':', 1)[0]};")
    bypass = spot_in(script, "        optimizer.step()", "optimizer.step()").split(":", 1)[1]
    assert sorted(static_findings(FIXTURES / "deepspeed")) == [(f"train.py:{bypass}", "DPL518"), (f"train.py:{place.split(':', 1)[1]}", "DPL507")]
    fixed = dplint_run("--nproc-per-node", "2", str(FIXTURES / "deepspeed_fixed" / "train.py"), "--out", str(tmp_path / "ckpt"), cwd=tmp_path)
    assert fixed.returncode == 0, fixed.stderr
    assert not [line for line in fixed.stdout.splitlines() if "DPL" in line]
    assert (tmp_path / "ckpt" / "latest").read_text() == "global_step4"


def test_an_fsdp2_script_runs_on_cpu_ranks_and_its_rank_zero_optimizer_state_dict_stops_at_the_scripts_line(tmp_path: Path) -> None:
    # The model's full state dict is gathered on every rank without CPU offload (DPL524, static only: the
    # ranks' memory is not measured); the optimizer's on rank 0 alone is the mismatch `dplint run` reports.
    script = FIXTURES / "fsdp" / "train.py"
    buggy = dplint_run("--nproc-per-node", "2", str(script), "--out", str(tmp_path / "full.pt"), cwd=tmp_path)
    assert buggy.returncode == 1, buggy.stderr
    [line] = buggy.stdout.splitlines()
    place = spot_in(script, "get_optimizer_state_dict(model, optimizer, options=offloaded)")
    assert line.startswith(f"{place}: DPL507 Collective mismatch: rank 0 is in dist.checkpoint.state_dict.get_optimizer_state_dict() at {place.rsplit(':', 1)[0]};")
    gathered = spot_in(script, "get_model_state_dict(model, options=options)")
    assert sorted(static_findings(FIXTURES / "fsdp")) == [
        (f"train.py:{gathered.split(':', 1)[1]}", "DPL524"),
        (f"train.py:{place.split(':', 1)[1]}", "DPL507"),
    ]
    fixed = dplint_run("--nproc-per-node", "2", str(FIXTURES / "fsdp_fixed" / "train.py"), "--out", str(tmp_path / "full.pt"), cwd=tmp_path)
    assert (fixed.returncode, fixed.stdout) == (0, ""), fixed.stderr
    saved = torch.load(tmp_path / "full.pt")
    assert sorted(saved["model"]) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    assert all(tensor.device.type == "cpu" for tensor in saved["model"].values())


ACCELERATE_DEEPSPEED = """\
import torch
from accelerate import Accelerator, DeepSpeedPlugin
from torch import nn

accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2, gradient_accumulation_steps=1))
model = nn.Linear(8, 1)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(32, 8)), batch_size=8)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for (inputs,) in loader:
    accelerator.backward(model(inputs).pow(2).mean())
    optimizer.step()
    optimizer.zero_grad()
{save}
"""


def test_accelerate_save_state_under_deepspeed_on_the_main_process_alone_is_reported_statically_and_at_its_line(tmp_path: Path) -> None:
    # Under DeepSpeed `save_state` saves every rank's shard: the main process alone waits in it.
    script = tmp_path / "train.py"
    script.write_text(ACCELERATE_DEEPSPEED.format(save="if accelerator.is_main_process:\n    accelerator.save_state('state')"))
    static = subprocess.run([sys.executable, "-m", "dplint", "--no-cache", "--preview", "--select", "DPL507", str(script)], capture_output=True, text=True)
    assert static.stdout.splitlines()[0].startswith(f"{script}:15:5: DPL507 Only some ranks run `accelerator.save_state()` (under DeepSpeed or FSDP)")
    buggy = dplint_run("--nproc-per-node", "2", str(script), cwd=tmp_path)
    assert buggy.returncode == 1, buggy.stderr
    [line] = [line for line in buggy.stdout.splitlines() if "DPL" in line]
    assert line.startswith("train.py:15:5: DPL507 Collective mismatch: rank 0 is in dist.barrier() at train.py:15;")
    script.write_text(ACCELERATE_DEEPSPEED.format(save="accelerator.save_state('state')"))
    fixed = dplint_run("--nproc-per-node", "2", str(script), cwd=tmp_path)
    assert fixed.returncode == 0, fixed.stderr
    assert (tmp_path / "state" / "pytorch_model" / "latest").exists() or any((tmp_path / "state").iterdir())


def test_fsdp2_runs_on_cpu_ranks_and_a_checkpoint_saved_on_rank_zero_alone_stops_at_its_line(tmp_path: Path) -> None:
    script = tmp_path / "fsdp2.py"
    script.write_text(
        "import torch.distributed as dist\nimport torch.distributed.checkpoint as dcp\nfrom torch import nn\n"
        "from torch.distributed.fsdp import fully_shard\n\n"
        "dist.init_process_group('nccl')\n"
        "model = fully_shard(nn.Linear(8, 8))\n"
        "model(__import__('torch').randn(2, 8)).sum().backward()\n"
        "if dist.get_rank() == 0:\n"
        "    dcp.save({'model': model.state_dict()}, checkpoint_id='ckpt')\n"
    )
    result = dplint_run(str(script), cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    [line] = result.stdout.splitlines()
    assert line.startswith("fsdp2.py:10:5: DPL507 Collective mismatch: rank 0 is in dist.gather_object(dst=0) at fsdp2.py:10;")


def test_an_fsdp2_full_state_dict_gathered_on_rank_zero_alone_is_a_mismatch_at_its_line(tmp_path: Path) -> None:
    script = tmp_path / "full_state.py"
    script.write_text(
        "import torch\nimport torch.distributed as dist\nfrom torch import nn\nfrom torch.distributed.fsdp import fully_shard\n"
        "from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict\n\n"
        "dist.init_process_group('nccl')\n"
        "model = fully_shard(nn.Linear(8, 8))\n"
        "model(torch.randn(2, 8)).sum().backward()\n"
        "options = StateDictOptions(full_state_dict=True, cpu_offload=True)\n"
        "{where}"
    )
    buggy = script.read_text().replace("{where}", "if dist.get_rank() == 0:\n    torch.save(get_model_state_dict(model, options=options), 'full.pt')\n")
    script.write_text(buggy)
    result = dplint_run(str(script), cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    [line] = result.stdout.splitlines()
    assert line.startswith("full_state.py:12:16: DPL507 Collective mismatch: rank 0 is in dist.checkpoint.state_dict.get_model_state_dict() at full_state.py:12;")
    static = subprocess.run([sys.executable, "-m", "dplint", "--no-cache", "--preview", "--select", "DPL507", "--format", "concise", str(script)], capture_output=True, text=True)
    assert static.stdout.startswith(f"{script}:12:16: DPL507 Only some ranks run `get_model_state_dict()`")
    # Every rank gathers, rank 0 alone writes: clean.
    script.write_text(buggy.replace("if dist.get_rank() == 0:\n    torch.save(get_model_state_dict(model, options=options), 'full.pt')\n",
                                    "state = get_model_state_dict(model, options=options)\nif dist.get_rank() == 0:\n    torch.save(state, 'full.pt')\n"))  # fmt: skip
    fixed = dplint_run(str(script), cwd=tmp_path)
    assert (fixed.returncode, fixed.stdout) == (0, ""), fixed.stderr
    static = subprocess.run([sys.executable, "-m", "dplint", "--no-cache", "--preview", "--select", "DPL507", str(script)], capture_output=True, text=True)
    assert static.returncode == 0, static.stdout


def test_fsdp1_is_refused_in_one_line_naming_the_wrap(tmp_path: Path) -> None:
    script = tmp_path / "fsdp1.py"
    script.write_text(
        "import torch.distributed as dist\nfrom torch import nn\n"
        "from torch.distributed.fsdp import FullyShardedDataParallel as FSDP\n\n"
        "dist.init_process_group('nccl')\n"
        "model = FSDP(nn.Linear(8, 8))\n"
    )
    result = dplint_run(str(script), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == (
        "dplint run: FullyShardedDataParallel at fsdp1.py:6 needs real GPUs: dplint runs FSDP2's `fully_shard` on CPU ranks, not FSDP1"
    )
    assert "Traceback" not in result.stderr


# never clean when the ranks did not run ---------------------------------------------------------
def test_without_emulated_gpus_a_script_that_spawns_one_process_per_gpu_starts_none_and_is_not_clean(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    script = PROGRAMS / "spawn_workers.py"
    assert run_main(["--timeout", str(TIMEOUT), "--gpus-per-node", "0", str(script)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"dplint run: 0 of 2 ranks joined a process group: mp.spawn(main_worker, nprocs=0) at {line_in(script, 'mp.spawn(')} started no process "
        "(torch.cuda.device_count() is 0: dplint hides CUDA)\n"
    )


def test_a_script_that_never_joins_a_process_group_is_not_clean(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "single.py").write_text("import torch\nprint(torch.ones(2).sum().item())\n")
    assert run_main(["--timeout", str(TIMEOUT), "single.py"]) == 2
    assert capsys.readouterr().err == "dplint run: 0 of 2 ranks joined a process group: ranks 0 and 1 never called init_process_group\n"


# scripts that start their own ranks ---------------------------------------------------------------
@pytest.mark.parametrize("start", ["mp.spawn(", "mp.start_processes("])
def test_a_script_that_spawns_its_ranks_runs_them_as_dplints_ranks_with_the_checks(tmp_path: Path, start: str) -> None:
    script = PROGRAMS / "spawn_workers.py"
    option = ["--start-processes"] if "start_processes" in start else []
    result = dplint_run(str(script), "--gpus", "2", "--no-set-epoch", *option, cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    [finding] = result.stdout.splitlines()
    assert finding.startswith(f"{spot_in(script, '# train sampler', 'DistributedSampler(')}: DPL501 ") and finding.endswith("(ranks 0 and 1).")
    assert result.stderr.splitlines()[:3] == [
        f"dplint: {start}main_worker, nprocs=2) at {line_in(script, start)} runs main_worker(LOCAL_RANK, ...) in each of the 2 ranks",
        f"dplint: backend 'nccl' runs as 'gloo' on CPU ({line_in(script, 'init_process_group')})",
        "dplint: init_process_group(init_method='tcp://127.0.0.1:23456') joins dplint's process group instead "
        f"({line_in(script, 'init_process_group')})",
    ]


def test_a_script_that_spawns_another_number_of_ranks_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    script = PROGRAMS / "spawn_workers.py"
    assert run_main(["--timeout", str(TIMEOUT), str(script), "--gpus", "4"]) == 2
    assert capsys.readouterr().err == (
        f"dplint run: mp.spawn(main_worker, nprocs=4) at {line_in(script, 'mp.spawn(')} asks for 4 ranks; dplint started 2: "
        "run it with --nproc-per-node 4\n"
    )


# the set-epoch check counts training passes ----------------------------------------------------------
@pytest.mark.parametrize("arguments", [[], ["--eval-train"]], ids=["peek-and-validation-loader", "eval-over-train-loader"])
def test_peeks_and_evaluation_passes_are_not_epochs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, arguments: List[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert run_main(["--timeout", str(TIMEOUT), str(PROGRAMS / "epoch_loop.py"), *arguments]) == 0
    assert capsys.readouterr().err.endswith("dplint run: 2 ranks finished; no distributed pitfalls found\n")


def test_two_training_epochs_in_the_same_order_are_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.chdir(tmp_path)
    script = PROGRAMS / "epoch_loop.py"
    assert run_main(["--timeout", str(TIMEOUT), str(script), "--no-set-epoch", "--eval-train"]) == 1
    [finding] = capsys.readouterr().out.splitlines()
    assert finding == (
        f"{spot_in(script, 'sampler=DistributedSampler(train_set)', 'DistributedSampler(')}: DPL501 This shuffling `DistributedSampler` "
        "starts a second training pass with its epoch still 0: every epoch has the same order (ranks 0 and 1)."
    )


# hangs reported at once ---------------------------------------------------------------------------
def test_a_rank_zero_only_barrier_is_reported_at_once_not_after_the_timeout(tmp_path: Path) -> None:
    script = PROGRAMS / "rank0_barrier.py"
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "dplint", "run", "--timeout", "60", str(script)],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert time.monotonic() - started < 30  # start-up included; the timeout would be 60 s
    assert result.returncode == 1
    assert result.stdout == (
        f"{spot_in(script, 'dist.barrier()')}: DPL507 Collective mismatch: rank 0 is in dist.barrier() at "
        f"{line_in(script, 'dist.barrier()')}; rank 1 is in DDP backward (gradient all-reduce) at {line_in(script, '.backward()')}.\n"
    )
    assert result.stderr == ""


def test_an_evaluation_forward_on_rank_zero_only_is_told_from_the_training_forward(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    # Both forwards broadcast the BatchNorm buffers; only the training one is followed by the gradient all-reduce.
    monkeypatch.chdir(tmp_path)
    script = PROGRAMS / "rank0_evaluation.py"
    assert run_main(["--timeout", str(TIMEOUT), str(script)]) == 1
    assert capsys.readouterr().out == (
        f"{spot_in(script, '# evaluation forward', 'model(')}: DPL507 Collective mismatch: rank 0 is in DDP forward under no_grad "
        f"(buffer broadcast) at {line_in(script, '# evaluation forward')}; rank 1 is in DDP forward (buffer broadcast) at "
        f"{line_in(script, '# training forward')}.\n"
    )
    assert run_main(["--timeout", str(TIMEOUT), str(script), "--every-rank"]) == 0


def test_marked_tests_may_start_dataloader_workers_and_a_spawn_that_starts_nothing_fails(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_children="""
        import pytest, torch, torch.distributed as dist, torch.multiprocessing as mp
        from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

        @pytest.mark.dplint(ranks=2, timeout=10)
        def test_workers():
            data = TensorDataset(torch.arange(16.0))
            loader = DataLoader(data, batch_size=4, sampler=DistributedSampler(data, shuffle=False), num_workers=2)
            assert len(list(loader)) == 2

        def worker(gpu):
            dist.all_reduce(torch.ones(1))

        @pytest.mark.dplint(ranks=2, timeout=10)
        def test_one_process_per_gpu():
            mp.spawn(worker, nprocs=torch.cuda.device_count())
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:asyncio")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*2 of 2 ranks joined a process group: mp.spawn(worker, nprocs=0) at test_children.py:15 started no process "
        "(torch.cuda.device_count() is 0: dplint hides CUDA)*"
    ])  # fmt: skip


# GPUs emulated on the CPU ranks -------------------------------------------------------------------
GPU_SCRIPTS = ["imagenet_gpus.py", "torchrun_tutorial.py", "accelerator_style.py"]


@pytest.mark.parametrize("name", GPU_SCRIPTS)
def test_gpu_scripts_run_unmodified_to_the_end_on_emulated_gpus(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    # set_device, .cuda(i)/.to(i)/device=, pin_memory, DDP device_ids, SyncBatchNorm-free DDP, mp.spawn over device_count().
    monkeypatch.chdir(tmp_path)
    assert run_main(["--timeout", str(TIMEOUT), str(PROGRAMS / name)]) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == "dplint run: 2 ranks finished; no distributed pitfalls found\n"


def test_a_nanogpt_style_script_runs_with_autocast_and_a_grad_scaler_and_says_each_emulation_once(tmp_path: Path) -> None:
    script = PROGRAMS / "nanogpt_style.py"
    result = dplint_run(str(script), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    notes = [line for line in result.stderr.splitlines() if line.startswith("dplint: ")]
    assert notes == [
        f"dplint: backend 'nccl' runs as 'gloo' on CPU ({line_in(script, 'init_process_group(backend')})",
        "dplint: autocast('cuda') runs as CPU autocast in bfloat16",
        "dplint: pin_memory leaves tensors in pageable memory: a CPU build of torch cannot pin",
    ]
    assert result.stderr.endswith("dplint run: 2 ranks finished; no distributed pitfalls found\n")


def test_the_default_device_and_torch_device_as_a_context_are_emulated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    script = PROGRAMS / "default_device_style.py"
    assert run_main(["--timeout", str(TIMEOUT), str(script)]) == 0
    assert capsys.readouterr().out == ""
    # Without set_device, the bare "cuda" of the default device is GPU 0 on every rank.
    assert run_main(["--timeout", str(TIMEOUT), str(script), "--no-set-device"]) == 1
    assert capsys.readouterr().out == (
        f"{spot_in(script, 'model = DDP(nn.Linear(4, 2))', 'nn.Linear(')}: DPL508 Ranks 0 and 1 all put this tensor on `cuda:0`: "
        "they share one GPU.\n"
    )


# DataParallel scripts: one process, N emulated GPUs ----------------------------------------------
def test_a_dataparallel_script_runs_unmodified_on_emulated_gpus_with_its_replicas_split_as_on_gpus(tmp_path: Path) -> None:
    result = dplint_run("--devices", "4", str(FIXTURES / "dataparallel_tutorial.fixed.py"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    # The tutorial's batch of 30 on 4 GPUs: chunks of 8, 8, 8 and 6, each printed by its replica's forward.
    sizes = [line.split("input size torch.Size([")[1].split(",")[0] for line in result.stdout.splitlines() if "In Model" in line]
    assert sizes[:4] == ["8", "8", "8", "6"]
    assert result.stderr.endswith("dplint run: the script finished on 4 emulated GPUs; no pitfalls found\n")


def test_a_dataparallel_scripts_batch_dimension_bug_is_found_at_its_forward(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.chdir(FIXTURES)
    assert run_main(["--devices", "2", "crnn_train.py"]) == 1
    [finding] = capsys.readouterr().out.splitlines()
    assert finding.startswith("crnn_model.py:48:5: DPL301 forward returned [25, 4, 37] per replica (output)")
    # Advice is a finding too: a last batch of 10 leaves 3 of 8 GPUs idle.
    assert run_main(["--devices", "8", "dataparallel_tutorial.fixed.py"]) == 1
    [finding] = capsys.readouterr().out.splitlines()
    assert finding.startswith("dataparallel_tutorial.fixed.py:44:5: DPL306 a batch of 10 on 8 devices splits into 5 chunks")


def test_advice_on_a_wrapped_torch_module_is_at_the_users_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    # nn.Sequential's forward is torch's: the advice goes to the line of the script that called the wrapper.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sequential.py").write_text(
        "import torch\nfrom torch import nn\n\nmodel = nn.DataParallel(nn.Sequential(nn.Linear(4, 2)))\noutput = model(torch.randn(8, 4))\n"
    )
    assert run_main(["--devices", "1", "sequential.py"]) == 1
    [finding] = capsys.readouterr().out.splitlines()
    assert finding.startswith("sequential.py:5:1: DPL307 ")


def test_a_dataparallel_run_fails_where_the_gpu_node_would(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.chdir(FIXTURES)
    assert run_main(["--devices", "2", "dataparallel_tutorial.py"]) == 1  # its "cuda: 0" (DPL102) is torch's error
    assert capsys.readouterr().err.startswith(
        "dplint run: the script failed at dataparallel_tutorial.py:19: RuntimeError: Invalid device string: 'cuda: 0'"
    )
    with pytest.raises(SystemExit):
        run_main(["--devices", "2", "--nproc-per-node", "2", "dataparallel_tutorial.py"])
    assert "--devices runs one process with N GPUs" in capsys.readouterr().err


# findings like the linter's ----------------------------------------------------------------------
def test_dplint_run_writes_its_findings_in_the_linters_machine_formats(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    import json
    import xml.etree.ElementTree as ElementTree

    monkeypatch.chdir(tmp_path)
    script = PROGRAMS / "torchrun_tutorial.py"
    run = ["--timeout", str(TIMEOUT), str(script), "--legacy-local-rank"]
    assert run_main(["--format", "json", "-o", "found.json", *run]) == 1
    assert capsys.readouterr().out == ""
    [finding] = json.loads((tmp_path / "found.json").read_text())
    row = int(line_in(script, "torch.cuda.set_device(local_rank)").rsplit(":", 1)[1])
    assert (finding["code"], finding["name"], finding["filename"], finding["location"]["row"], finding["ranks"]) == (
        "DPL508", "missing-set-device", str(script), row, [0, 1]
    )
    assert finding["help"] and finding["message"] == "Ranks 0 and 1 all select `cuda:0`: they share one GPU."

    assert run_main(["--format", "sarif", *run]) == 1
    [result] = json.loads(capsys.readouterr().out)["runs"][0]["results"]
    assert result["ruleId"] == "DPL508" and result["locations"][0]["physicalLocation"]["region"]["startLine"] == row

    assert run_main(["--format", "github", *run]) == 1
    assert capsys.readouterr().out.startswith(f"::error title=dplint (DPL508),file={script},line={row},")

    assert run_main(["--format", "junit", *run]) == 1
    [case] = ElementTree.fromstring(capsys.readouterr().out).findall(".//testcase")
    assert case.get("name") == "org.dplint.DPL508" and case.get("line") == str(row) and case.find("failure") is not None


def _machine_report(output: str, chosen: str) -> Any:
    """The report on stdout, parsed as its consumer parses it; raises when anything else is mixed in."""
    import json
    import xml.etree.ElementTree as ElementTree

    if chosen == "junit":
        return ElementTree.fromstring(output)
    if chosen == "json-lines":
        return [json.loads(line) for line in output.splitlines()]
    if chosen == "github":
        assert all(line.startswith("::") for line in output.splitlines()), output
        return output
    return json.loads(output)


@pytest.mark.parametrize("chosen", ["json", "json-lines", "sarif", "junit", "gitlab", "github"])
def test_a_machine_format_on_stdout_holds_the_report_alone_and_the_scripts_prints_go_to_stderr(tmp_path: Path, chosen: str) -> None:
    (tmp_path / "chatty.py").write_text(
        "import subprocess, sys\nimport torch.distributed as dist\n\n"
        "dist.init_process_group('gloo')\n"
        "print('rank', dist.get_rank(), 'says hello')\n"
        "subprocess.run([sys.executable, '-c', 'print(\"a child says hello\")'])\n"
    )
    result = dplint_run("--nproc-per-node", "1", "--format", chosen, "chatty.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    _machine_report(result.stdout, chosen)
    assert "rank 0 says hello" in result.stderr and "a child says hello" in result.stderr


def test_a_pitfall_that_stops_the_ranks_is_a_finding_in_every_format(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    import json

    monkeypatch.chdir(tmp_path)
    script = PROGRAMS / "rank0_barrier.py"
    assert run_main(["--timeout", "60", "--format", "json", str(script)]) == 1
    captured = capsys.readouterr()
    [finding] = json.loads(captured.out)
    assert finding["code"] == "DPL507" and f"{script}:{finding['location']['row']}" == line_in(script, "dist.barrier()")
    assert captured.err == ""  # the finding says it all: no second account on stderr


COLLECTIVE_RESULT = """\
import torch
import torch.distributed as dist


def mean(value):
    return dist.all_reduce(value) / dist.get_world_size()


dist.init_process_group("gloo")
correct = torch.tensor([3.0])
{body}
"""


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("correct = dist.all_reduce(correct)\naccuracy = correct / 2",
         "{script}:11:11: DPL512 `dist.all_reduce` works in place and returns `None` here; `correct` holds that `None` at "
         "{script}:12, which raised TypeError: unsupported operand type(s) for /: 'NoneType' and 'int'."),
        ("print(mean(correct))",
         "{script}:6:12: DPL512 `dist.all_reduce` works in place and returns `None` here; this line uses that `None`: TypeError: "
         "unsupported operand type(s) for /: 'NoneType' and 'int'."),
    ],
    ids=["assigned", "used-in-its-line"],
)
def test_a_collectives_none_result_that_raises_is_explained_as_dpl512(
    body: str, expected: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "metric.py").write_text(COLLECTIVE_RESULT.format(body=body))
    assert run_main(["--timeout", str(TIMEOUT), "metric.py"]) == 1
    captured = capsys.readouterr()
    assert captured.out == expected.format(script="metric.py") + "\n"
    assert captured.err == ""


def test_a_none_that_no_collective_returned_stays_the_users_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    body = "dist.all_reduce(correct)\nbest = None\nprint(best + correct)"
    (tmp_path / "metric.py").write_text(COLLECTIVE_RESULT.format(body=body))
    assert run_main(["--timeout", str(TIMEOUT), "metric.py"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "failed at metric.py:13: TypeError: unsupported operand type(s) for +: 'NoneType'" in captured.err.splitlines()[0]


def test_a_clean_run_writes_an_empty_machine_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    import json

    monkeypatch.chdir(tmp_path)
    assert run_main(["--timeout", str(TIMEOUT), "--format", "json", str(PROGRAMS / "torchrun_tutorial.py")]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == []
    assert captured.err.endswith("dplint run: 2 ranks finished; no distributed pitfalls found\n")


def test_every_rank_on_gpu_zero_is_found_where_it_selects_the_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    # An argparse --local_rank that torchrun never passes: every rank keeps its default, 0.
    monkeypatch.chdir(tmp_path)
    script = PROGRAMS / "torchrun_tutorial.py"
    assert run_main(["--timeout", str(TIMEOUT), str(script), "--legacy-local-rank"]) == 1
    assert capsys.readouterr().out == (
        f"{spot_in(script, 'torch.cuda.set_device(local_rank)')}: DPL508 Ranks 0 and 1 all select `cuda:0`: they share one GPU.\n"
    )


def test_every_rank_resuming_onto_gpu_zero_is_found_at_its_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    script = PROGRAMS / "imagenet_gpus.py"
    assert run_main(["--timeout", str(TIMEOUT), str(script), "--epochs", "1", "--save", "first.pt"]) == 0
    assert run_main(["--timeout", str(TIMEOUT), str(script), "--epochs", "1", "--resume", "first.pt"]) == 0
    capsys.readouterr()
    assert run_main(["--timeout", str(TIMEOUT), str(script), "--epochs", "1", "--resume", "first.pt", "--resume-on", "gpu0"]) == 1
    assert capsys.readouterr().out == (
        f"{spot_in(script, '# every rank onto GPU 0', 'torch.load(')}: DPL506 Ranks 0 and 1 all load this checkpoint onto `cuda:0`: "
        "they share one GPU.\n"
    )


@pytest.mark.parametrize(
    ("name", "arguments", "failing_line", "found"),
    [
        # The bare "cuda" without set_device is GPU 0 on every rank; DDP moves rank 1's batch to its device_ids, cuda:1.
        ("nanogpt_style.py", ["--device", "cuda"], "logits, loss = model(X, Y)", ("model.to(device)", "model.to(device)", "put this model on")),
        # The unwrapped model of rank 1 is on cuda:1; its evaluation batch on cuda:0.
        ("accelerator_style.py", ["--eval-device", "cuda:0"], "ddp_model.module(batch)", ("batch = torch.randn", "torch.randn", "put this tensor on")),
    ],
    ids=["model-on-gpu0-behind-ddp", "batch-on-gpu0"],
)
def test_tensors_of_two_gpus_meeting_raise_as_torch_does(
    name: str, arguments: List[str], failing_line: str, found: Tuple[str, str, str],
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)
    script = PROGRAMS / name
    assert run_main(["--timeout", str(TIMEOUT), str(script), *arguments]) == 1
    captured = capsys.readouterr()
    assert captured.out == f"{spot_in(script, found[0], found[1])}: DPL508 Ranks 0 and 1 all {found[2]} `cuda:0`: they share one GPU.\n"
    assert captured.err.startswith(
        f"dplint run: rank 1 failed at {line_in(script, failing_line)}: RuntimeError: Expected all tensors to be on the same "
        "device, but found at least two devices, cuda:"
    )


def test_a_script_that_spawns_one_process_per_emulated_gpu_runs_them_with_the_checks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    script = PROGRAMS / "spawn_workers.py"
    assert run_main(["--timeout", str(TIMEOUT), str(script), "--no-set-epoch", "--epochs", "2"]) == 1
    assert capsys.readouterr().out.startswith(f"{spot_in(script, '# train sampler', 'DistributedSampler(')}: DPL501 ")


def test_an_error_a_wrapper_catches_before_exiting_is_reported_at_the_users_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    script = PROGRAMS / "caught_by_a_wrapper.py"  # try: main() except Exception: sys.exit(1)
    assert run_main(["--timeout", str(TIMEOUT), str(script)]) == 1
    assert f"dplint run: rank 1 failed at {line_in(script, '# rank 1 fails')}: ValueError: no such shard\n" in capsys.readouterr().err


def test_an_error_raised_in_pythons_own_modules_is_reported_at_the_users_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "read_config.py"
    script.write_text(
        "import json\nimport torch.distributed as dist\n\n"
        "dist.init_process_group('gloo')\n"
        "config = json.loads('{' if dist.get_rank() == 1 else '{}')  # rank 1 reads a broken file\n"
    )
    assert run_main(["--timeout", str(TIMEOUT), str(script)]) == 1
    said = capsys.readouterr().err  # json/decoder.py raised it; the line to look at is the script's
    assert "dplint run: rank 1 failed at read_config.py:5: JSONDecodeError: Expecting property name" in said


def test_an_error_hydra_catches_is_reported_at_the_users_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("hydra")
    monkeypatch.chdir(tmp_path)  # hydra writes its outputs/ folder here
    script = PROGRAMS / "hydra_entry.py"
    assert run_main(["--timeout", str(TIMEOUT), str(script)]) == 1
    err = capsys.readouterr().err
    assert f"dplint run: rank 1 failed at {line_in(script, '# rank 1 fails')}: ValueError: no such shard\n" in err
    assert "hydra/_internal" not in err.splitlines()[-1]


@pytest.mark.parametrize(
    ("files", "failing"),
    [
        ({"train.py": "import torch\nx = = 1\n"}, "train.py:2: SyntaxError: invalid syntax"),
        ({"train.py": "import helper\n", "helper.py": "def f():\n    return 1\n        x = 2\n"}, "helper.py:3: IndentationError: unexpected indent"),
    ],
    ids=["the-script", "a-module-it-imports"],
)
def test_code_that_does_not_compile_is_reported_at_its_line(
    files: Dict[str, str], failing: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    # None of the file's frames ever ran: the SyntaxError itself names the file and the line.
    monkeypatch.chdir(tmp_path)
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert run_main(["--timeout", str(TIMEOUT), "train.py"]) == 1
    said = capsys.readouterr().err  # both ranks fail; either may be first
    assert f"dplint run: rank 0 failed at {failing}\n" in said or f"dplint run: rank 1 failed at {failing}\n" in said
