"""DDP/torchrun rules (DPL5xx) across the files of a project, through the Python API and the CLI.

The per-rule VALID/INVALID examples run in tests/test_rule_examples.py; these tests cover what a single
file cannot show: facts that span files, programs that stay apart, and the fixture project's twin.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from dplint import lint_paths, lint_source
from dplint.analysis.facts import FileFacts, ProjectFacts, collect_file_facts, scan_distributed
from dplint.config import resolve_settings

ROOT = Path(__file__).resolve().parent.parent

DATA = """
from torch.utils.data import DataLoader, DistributedSampler

def build_loader(dataset):
    sampler = DistributedSampler(dataset)
    return DataLoader(dataset, batch_size=32, sampler=sampler)
"""
TRAIN = """
import torch.distributed as dist
from data import build_loader

def main(dataset, model):
    dist.init_process_group("gloo")
    loader = build_loader(dataset)
    for epoch in range(10):
        {set_epoch}
        for x, y in loader:
            model(x).sum().backward()
"""


def write(root: Path, relative: str, text: str) -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def lint(root: Path, select=("DPL5",)):
    cwd = os.getcwd()
    os.chdir(root)
    try:
        return lint_paths(["."], resolve_settings(root, {"select": list(select), "preview": True}), cache=False)
    finally:
        os.chdir(cwd)


def codes(result):
    return sorted((f.path, f.location.row, f.code) for f in result.findings)


def test_set_epoch_in_the_trainer_silences_the_sampler_built_in_the_data_module(tmp_path):
    write(tmp_path, "data.py", DATA)
    write(tmp_path, "train.py", TRAIN.format(set_epoch="loader.sampler.set_epoch(epoch)"))
    assert codes(lint(tmp_path)) == []


def test_a_sampler_never_stepped_anywhere_in_the_program_is_reported_where_it_is_built(tmp_path):
    write(tmp_path, "data.py", DATA)
    write(tmp_path, "train.py", TRAIN.format(set_epoch="pass"))
    assert codes(lint(tmp_path)) == [("data.py", 5, "DPL501")]


def test_a_custom_sampler_defining_set_epoch_counts_as_stepping(tmp_path):
    # The data module wraps the sampler in its own, whose set_epoch steps the inner one.
    write(tmp_path, "data.py", "from samplers import Chunked\n" + textwrap.dedent(DATA))
    write(tmp_path, "train.py", TRAIN.format(set_epoch="pass"))
    write(tmp_path, "samplers.py", "class Chunked:\n    def set_epoch(self, epoch):\n        self.inner.set_epoch(epoch)\n")
    assert codes(lint(tmp_path)) == []


def test_a_sibling_program_setting_the_epoch_does_not_cover_another(tmp_path):
    # Both scripts build their loader with data.py's sampler; only one of them steps it.
    write(tmp_path, "data.py", DATA)
    write(tmp_path, "train.py", TRAIN.format(set_epoch="loader.sampler.set_epoch(epoch)") + "\nmain(load(), build())\n")
    assert codes(lint(tmp_path)) == []
    write(tmp_path, "finetune.py", TRAIN.format(set_epoch="pass") + "\nmain(load(), build())\n")
    assert codes(lint(tmp_path)) == [("data.py", 5, "DPL501")]
    # A test that steps it is no program of the scripts' either.
    write(tmp_path, "finetune.py", TRAIN.format(set_epoch="pass") + "\nmain(load(), build())\n")
    write(tmp_path, "test_data.py", "from data import build_loader\n\ndef test_order():\n    build_loader(range(8)).sampler.set_epoch(1)\n")
    assert codes(lint(tmp_path)) == [("data.py", 5, "DPL501")]


def test_an_evaluation_program_that_builds_the_training_sampler_but_never_trains_needs_no_set_epoch(tmp_path):
    # evaluate.py builds the same loaders to reach its validation data; it never runs a backward.
    write(tmp_path, "data.py", DATA)
    write(tmp_path, "train.py", TRAIN.format(set_epoch="loader.sampler.set_epoch(epoch)") + "\nmain(load(), build())\n")
    evaluate = (
        "import torch.distributed as dist\nfrom data import build_loader\n\n\n"
        "def main(dataset, model):\n    dist.init_process_group('gloo')\n    loader = build_loader(dataset)\n"
        "    for epoch in range(3):\n        for x, y in loader:\n            print(model(x))\n\n\nmain(load(), build())\n"
    )
    write(tmp_path, "evaluate.py", evaluate)
    assert codes(lint(tmp_path)) == []
    # A second program that trains without stepping it is still reported.
    write(tmp_path, "evaluate.py", evaluate.replace("print(model(x))", "model(x).sum().backward()"))
    assert codes(lint(tmp_path)) == [("data.py", 5, "DPL501")]


def test_two_projects_linted_together_keep_their_own_facts(tmp_path):
    # The same module names in two folders: the set_epoch of one must not silence the other.
    write(tmp_path, "good/data.py", DATA)
    write(tmp_path, "good/train.py", TRAIN.format(set_epoch="loader.sampler.set_epoch(epoch)"))
    write(tmp_path, "bad/data.py", DATA)
    write(tmp_path, "bad/train.py", TRAIN.format(set_epoch="pass"))
    assert codes(lint(tmp_path)) == [(os.path.join("bad", "data.py"), 5, "DPL501")]


def test_a_module_joins_the_program_of_the_script_that_calls_it(tmp_path):
    engine = """
    import torch

    def fit(model, loader, epochs):
        for epoch in range(epochs):
            for x in loader:
                model(x).sum().backward()
            torch.save(model.state_dict(), "last.pt")
    """
    write(tmp_path, "engine.py", engine)
    assert codes(lint(tmp_path)) == []  # no process group: a single-process program
    write(tmp_path, "train.py", "import torch.distributed as dist\nfrom engine import fit\ndist.init_process_group('gloo')\n")
    assert codes(lint(tmp_path)) == []  # imported, never called: `fit` is not part of this program
    write(tmp_path, "train.py", "import torch.distributed as dist\nfrom engine import fit\ndist.init_process_group('gloo')\nfit(model, loader, 3)\n")
    assert codes(lint(tmp_path)) == [("engine.py", 8, "DPL505")]


def test_an_unsharded_training_loader_in_a_data_module_of_a_ddp_program(tmp_path):
    write(tmp_path, "data.py", "from torch.utils.data import DataLoader\n\ndef loader(ds):\n    return DataLoader(ds, shuffle=True)\n")
    assert codes(lint(tmp_path)) == []
    write(tmp_path, "train.py", "from torch.nn.parallel import DistributedDataParallel as DDP\nimport data\nmodel = DDP(net)\n")
    assert codes(lint(tmp_path)) == []  # imported, never called: not part of the program
    write(tmp_path, "train.py", "from torch.nn.parallel import DistributedDataParallel as DDP\nimport data\nmodel = DDP(net)\ntrain_loader = data.loader(ds)\n")
    assert codes(lint(tmp_path)) == [("data.py", 4, "DPL503")]


ACCELERATE_TRAIN = """\
import torch
from accelerate import Accelerator
import data


def train(accelerator, model, optimizer, loader):
    for step, batch in enumerate(loader):
        accelerator.backward(model(batch).sum())
        optimizer.step()


def main():
    accelerator = Accelerator()
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.AdamW(model.parameters())
    model, optimizer = accelerator.prepare(model, optimizer)
    {loaders}
    train(accelerator, model, optimizer, train_dl)


if __name__ == "__main__":
    main()
"""


def test_an_accelerate_training_loader_is_followed_through_files_to_prepare(tmp_path):
    write(tmp_path, "data.py", "from torch.utils.data import DataLoader\n\ndef build(ds):\n    return DataLoader(ds, shuffle=True, batch_size=8)\n")
    # Built in one file, returned, and iterated for training in another without being prepared: the loop.
    write(tmp_path, "train.py", ACCELERATE_TRAIN.format(loaders="train_dl = data.build(ds)"))
    assert codes(lint(tmp_path, ("DPL503",))) == [("train.py", 7, "DPL503")]
    write(tmp_path, "train.py", ACCELERATE_TRAIN.format(loaders="train_dl = accelerator.prepare(data.build(ds))"))
    assert codes(lint(tmp_path, ("DPL503",))) == []
    write(tmp_path, "train.py", ACCELERATE_TRAIN.format(loaders="train_dl, val_dl = accelerator.prepare(data.build(ds), data.build(val))"))
    assert codes(lint(tmp_path, ("DPL503",))) == []
    # Prepared by the function that builds it, in the other file.
    write(tmp_path, "data.py", "from torch.utils.data import DataLoader\n\ndef build(accelerator, ds):\n    return accelerator.prepare(DataLoader(ds, shuffle=True, batch_size=8))\n")
    write(tmp_path, "train.py", ACCELERATE_TRAIN.format(loaders="train_dl = data.build(accelerator, ds)"))
    assert codes(lint(tmp_path, ("DPL503",))) == []


def test_an_accelerate_training_loader_built_here_is_reported_where_it_is_built(tmp_path):
    write(tmp_path, "data.py", "")
    built = "train_dl = torch.utils.data.DataLoader(ds, shuffle=True, batch_size=8)"
    write(tmp_path, "train.py", ACCELERATE_TRAIN.format(loaders=built))
    assert codes(lint(tmp_path, ("DPL503",))) == [("train.py", 17, "DPL503")]
    (finding,) = lint(tmp_path, ("DPL503",)).findings
    assert "accelerator.prepare" in finding.message and "accelerator.prepare" in finding.help
    write(tmp_path, "train.py", ACCELERATE_TRAIN.format(loaders=built + "; train_dl = accelerator.prepare(train_dl)"))
    assert codes(lint(tmp_path, ("DPL503",))) == []
    write(tmp_path, "train.py", ACCELERATE_TRAIN.format(loaders="loaders = [" + built.partition(" = ")[2] + ", val]; train_dl, val_dl = accelerator.prepare(*loaders)"))
    assert codes(lint(tmp_path, ("DPL503",))) == []
    write(tmp_path, "train.py", ACCELERATE_TRAIN.format(loaders=built + "; train_dl = accelerator.prepare_data_loader(train_dl)"))
    assert codes(lint(tmp_path, ("DPL503",))) == []
    sampled = "train_dl = torch.utils.data.DataLoader(ds, batch_size=8, sampler=torch.utils.data.DistributedSampler(ds))"
    write(tmp_path, "train.py", ACCELERATE_TRAIN.format(loaders=sampled))
    assert codes(lint(tmp_path, ("DPL503",))) == []
    # The rank's own shard of the data: sharded by the program itself.
    shard = "train_dl = torch.utils.data.DataLoader(ds.shard(accelerator.num_processes, accelerator.process_index), shuffle=True)"
    write(tmp_path, "train.py", ACCELERATE_TRAIN.format(loaders=shard))
    assert codes(lint(tmp_path, ("DPL503",))) == []


def test_local_rank_argument_is_fine_when_another_file_reads_the_environment(tmp_path):
    write(tmp_path, "cli.py", 'import argparse\np = argparse.ArgumentParser()\np.add_argument("--local_rank", type=int)\n')
    write(tmp_path, "train.py", 'import os\nimport torch.distributed as dist\nimport cli\nrank = int(os.environ["LOCAL_RANK"])\ndist.init_process_group("gloo")\n')
    assert codes(lint(tmp_path)) == []
    write(tmp_path, "train.py", 'import torch.distributed as dist\nimport cli\ndist.init_process_group("gloo")\n')
    assert codes(lint(tmp_path)) == [], "the parsed local rank is never read: the option only accepts the old launcher's argument"
    write(tmp_path, "train.py", 'import torch, torch.distributed as dist\nimport cli\nargs = cli.p.parse_args()\ntorch.cuda.set_device(args.local_rank)\ndist.init_process_group("nccl")\n')
    assert codes(lint(tmp_path)) == [("cli.py", 3, "DPL510")]


def test_a_module_imported_from_its_package_by_name_is_part_of_the_program(tmp_path):
    # `from pkg import dist` imports the submodule pkg/dist.py, whose setup reads LOCAL_RANK.
    write(tmp_path, "pkg/dist.py", 'import os\nimport torch.distributed as dist\ndef init(args):\n    args.gpu = int(os.environ["LOCAL_RANK"])\n    dist.init_process_group("nccl")\n')
    train = 'import argparse\nfrom pkg import {name} as dist_utils\np = argparse.ArgumentParser()\np.add_argument("--local_rank", type=int, default=0)\nargs = p.parse_args()\ndist_utils.init(args)\nprint(args.local_rank)\n'
    write(tmp_path, "train.py", train.format(name="dist"))
    assert codes(lint(tmp_path, ("DPL510",))) == []
    write(tmp_path, "pkg/__init__.py", "")
    assert codes(lint(tmp_path, ("DPL510",))) == []
    write(tmp_path, "pkg/setup.py", 'import torch.distributed as dist\nfrom pkg import ckpt\ndef init(args):\n    dist.init_process_group("nccl")\n')
    # A checkpoint helper that reads LOCAL_RANK to let one process per node download picks no device.
    write(tmp_path, "pkg/ckpt.py", 'import os\ndef fetch(url):\n    if int(os.environ.get("LOCAL_RANK", 0)) == 0:\n        download(url)\n')
    write(tmp_path, "train.py", train.format(name="setup"))
    assert codes(lint(tmp_path, ("DPL510",))) == [("train.py", 4, "DPL510")]


def test_local_rank_argument_other_sources_count_only_where_the_argument_is_read(tmp_path):
    write(tmp_path, "cli.py", 'import argparse\np = argparse.ArgumentParser()\np.add_argument("--local_rank", type=int, default=0)\n')
    write(tmp_path, "train.py", 'import torch, torch.distributed as dist\nimport cli, tools\nargs = cli.p.parse_args()\ntorch.cuda.set_device(args.local_rank)\ndist.init_process_group("nccl")\n')
    # A helper of the program that spawns its own workers says nothing about how train.py's ranks start.
    write(tmp_path, "tools.py", 'import torch.multiprocessing as mp\ndef run(fn):\n    mp.spawn(fn, nprocs=2)\n')
    assert codes(lint(tmp_path)) == [("cli.py", 3, "DPL510")]
    # Where the argument is read, an overwrite from the global rank is another source.
    write(tmp_path, "train.py", 'import torch, torch.distributed as dist\nimport cli\nargs = cli.p.parse_args()\ndist.init_process_group("nccl")\nargs.local_rank = dist.get_rank() % torch.cuda.device_count()\ntorch.cuda.set_device(args.local_rank)\n')
    assert codes(lint(tmp_path)) == []
    # So is one of several targets given a helper's result (`args.local_rank, args.rank = get_envs()`).
    write(tmp_path, "train.py", 'import torch, torch.distributed as dist\nimport cli, envs\nargs = cli.p.parse_args()\nargs.local_rank, args.rank = envs.get_envs()\ntorch.cuda.set_device(args.local_rank)\ndist.init_process_group("nccl")\n')
    assert codes(lint(tmp_path)) == []
    write(tmp_path, "train.py", 'import torch, torch.distributed as dist\nimport cli\nargs = cli.p.parse_args()\nargs.local_rank, args.rank = args.local_rank, 0\ntorch.cuda.set_device(args.local_rank)\ndist.init_process_group("nccl")\n')
    assert codes(lint(tmp_path)) == [("cli.py", 3, "DPL510")], "the parsed value copied back is no other source"
    write(tmp_path, "train.py", 'import torch, torch.distributed as dist\nimport cli\nargs = cli.p.parse_args()\nsaved = args.rank, args.local_rank\nargs.cfg, args.rank, args.local_rank = "", *saved\ntorch.cuda.set_device(args.local_rank)\ndist.init_process_group("nccl")\n')
    assert codes(lint(tmp_path)) == [("cli.py", 3, "DPL510")], "values put back from a starred tuple are not known to be new"


def test_complementary_rank_branches_are_paired_and_a_lone_one_is_not():
    paired = """
    import torch.distributed as dist

    def prepare(local_rank):
        if local_rank not in (-1, 0):
            dist.barrier()
        download()
        if local_rank == 0:
            dist.barrier()
    """
    assert lint_source(textwrap.dedent(paired), select=["DPL507"]) == []
    lone = paired.replace("        if local_rank not in (-1, 0):\n            dist.barrier()\n", "")
    assert [f.location.row for f in lint_source(textwrap.dedent(lone), select=["DPL507"])] == [7]


def test_both_branches_of_one_rank_condition_with_the_same_collective_are_fine():
    code = """
    import torch.distributed as dist
    if dist.get_rank() == 0:
        objects = [load_config()]
        dist.broadcast_object_list(objects, src=0)
    else:
        objects = [None]
        dist.broadcast_object_list(objects, src=0)
    """
    assert lint_source(textwrap.dedent(code), select=["DPL507"]) == []


def test_mode_checks_and_rank_flags_are_not_rank_conditions():
    code = """
    import torch.distributed as dist
    if args.local_rank != -1:
        dist.barrier()  # distributed mode: the same on every rank
    if args.eval_on_rank0:
        dist.barrier()  # a flag, the same on every rank
    if dist.get_world_size() > 1:
        dist.barrier()
    """
    assert lint_source(textwrap.dedent(code), select=["DPL507"]) == []


def test_the_fixture_project_and_its_fixed_twin_through_the_cli():
    command = [sys.executable, "-m", "dplint", "--no-cache", "--format", "concise", "--select", "ALL", "--preview"]
    fixed = subprocess.run([*command, "fixtures/ddp_project_fixed"], cwd=ROOT, capture_output=True, text=True)
    assert (fixed.returncode, fixed.stdout.strip()) == (0, "All checks passed!")
    buggy = subprocess.run([*command, "fixtures/ddp_project"], cwd=ROOT, capture_output=True, text=True)
    reported = {line.split(" ")[1] for line in buggy.stdout.splitlines() if ": DPL" in line}
    expected = {f"DPL5{n:02d}" for n in range(1, 14)}  # DPL509 is advice, off by default: selected here
    assert buggy.returncode == 1 and reported == expected


def test_distributed_facts_are_cheap_to_skip_and_part_of_the_cache_key():
    assert scan_distributed("import torch.nn as nn\n\nclass Net(nn.Module):\n    pass\n") is None
    data = collect_file_facts(textwrap.dedent(DATA), "data", "", "data.py", "/project/data.py")
    stepped = collect_file_facts(textwrap.dedent(TRAIN.format(set_epoch="loader.sampler.set_epoch(epoch)")), "train", "", "train.py", "/project/train.py")
    unstepped = collect_file_facts(textwrap.dedent(TRAIN.format(set_epoch="pass")), "train", "", "train.py", "/project/train.py")
    assert ProjectFacts.build([data, stepped]).digest != ProjectFacts.build([data, unstepped]).digest
    assert ProjectFacts.build([data, stepped]).distributed.program_of("/project/data.py").sets_epoch
    assert ProjectFacts.build([FileFacts("lone", "/project/lone.py")]).distributed.program_of("/project/lone.py") is None


# ----- which programs start a process group ---------------------------------------------------------

SAVE_EVERY_EPOCH = """
import torch
from utils import collate

def train(model, loader, epochs):
    for epoch in range(epochs):
        for x in loader:
            model(x).sum().backward()
        torch.save(model.state_dict(), "last.pt")

if __name__ == "__main__":
    train(build(), load(collate), 10)
"""
UTILS = """
import torch.distributed as dist

def collate(batch):
    return batch

def init_distributed_mode(args):
    dist.init_process_group("nccl")
"""


def test_a_script_that_imports_a_module_for_something_else_is_not_a_distributed_program(tmp_path):
    # pytorch-YOLOv4: the DataParallel script imports a collate function from a module whose
    # `init_distributed_mode` only another script calls.
    write(tmp_path, "utils.py", UTILS)
    write(tmp_path, "train.py", SAVE_EVERY_EPOCH)
    write(tmp_path, "train_ddp.py", "import utils\n\nif __name__ == '__main__':\n    utils.init_distributed_mode(None)\n")
    assert codes(lint(tmp_path, select=("DPL505",))) == []
    # The same script calling the setup is one.
    write(tmp_path, "train.py", SAVE_EVERY_EPOCH.replace("from utils import collate", "from utils import collate, init_distributed_mode").replace(
        "    train(build()", "    init_distributed_mode(None)\n    train(build()"))
    assert codes(lint(tmp_path, select=("DPL505",))) == [("train.py", 9, "DPL505")]


def test_a_function_handed_to_spawn_by_name_makes_the_script_distributed(tmp_path):
    # diffwave: `from learner import train_distributed` then `spawn(train_distributed, ...)`.
    write(tmp_path, "learner.py", "import torch, torch.distributed as dist\n\ndef train_distributed(rank, n):\n    dist.init_process_group('nccl', rank=rank, world_size=n)\n    for epoch in range(3):\n        torch.save({}, 'weights.pt')\n")
    write(tmp_path, "main.py", "from torch.multiprocessing import spawn\nfrom learner import train_distributed\n\nif __name__ == '__main__':\n    spawn(train_distributed, args=(2,), nprocs=2)\n")
    assert codes(lint(tmp_path, select=("DPL505",))) == [("learner.py", 6, "DPL505")]


def test_a_test_runner_importing_every_test_does_not_join_them_into_one_program(tmp_path):
    # MONAI: one test starts a group when run; a runner imports every test and starts none itself.
    write(tmp_path, "tests/test_ddp.py", "import torch.distributed as dist\n\ndef test_group():\n    dist.init_process_group('gloo')\n\nif __name__ == '__main__':\n    test_group()\n")
    write(tmp_path, "tests/test_single.py", SAVE_EVERY_EPOCH.replace("from utils import collate\n", "collate = None\n"))
    write(tmp_path, "tests/runner.py", "import unittest\nimport test_ddp, test_single\n\nif __name__ == '__main__':\n    unittest.main()\n")
    assert codes(lint(tmp_path, select=("DPL505",))) == []


SPAWNED_SAVE = """
import argparse
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

parser = argparse.ArgumentParser()
parser.add_argument("--multiprocessing-distributed", action="store_true")
parser.add_argument("--rank", type=int, default=0)

def main_worker(gpu, ngpus_per_node, args):
    args.rank = args.rank * ngpus_per_node + gpu
    dist.init_process_group("nccl", rank=args.rank)
    for epoch in range(3):
        if {guard}:
            torch.save({{}}, "checkpoint.pth")

if __name__ == "__main__":
    args = parser.parse_args()
    {before_spawn}
    mp.spawn(main_worker, nprocs=4, args=(4, args))
"""


def test_a_rank_test_beside_a_flag_for_runs_without_a_group_is_the_main_process_test(tmp_path):
    # pytorch/examples imagenet, simsiam: the flag tells one-process runs; in a group the rank test decides.
    guard = "not args.multiprocessing_distributed or (args.multiprocessing_distributed and args.rank % ngpus_per_node == 0)"
    write(tmp_path, "main.py", SPAWNED_SAVE.format(guard=guard, before_spawn="pass"))
    assert codes(lint(tmp_path, select=("DPL505",))) == []
    # semseg: the option is also assigned, under a condition; the command line's value still counts.
    write(tmp_path, "main.py", SPAWNED_SAVE.format(guard=guard, before_spawn="if torch.cuda.device_count() == 1:\n        args.multiprocessing_distributed = False"))
    assert codes(lint(tmp_path, select=("DPL505",))) == []
    # The flag alone guards nothing between the ranks.
    write(tmp_path, "main.py", SPAWNED_SAVE.format(guard="not args.multiprocessing_distributed or epoch == 2", before_spawn="pass"))
    assert codes(lint(tmp_path, select=("DPL505",))) == [("main.py", 16, "DPL505")]


def test_an_option_updated_in_place_keeps_what_the_command_line_gave(tmp_path):
    # CodeBERT: `--local_rank` made global with `+=`; `in [-1, 0]` is then rank 0 alone.
    script = """
    import argparse
    import torch
    import torch.distributed as dist

    def train(args, model):
        for epoch in range(3):
            if {guard}:
                torch.save(model.state_dict(), "model.bin")

    def main():
        parser = argparse.ArgumentParser()
        parser.add_argument("--local_rank", type=int, default=-1)
        parser.add_argument("--node_index", type=int, default=0)
        args = parser.parse_args()
        if args.local_rank != -1:
            dist.init_process_group("nccl")
            args.local_rank += args.node_index * 8
        train(args, torch.nn.Linear(2, 2))

    main()
    """
    write(tmp_path, "run.py", script.format(guard="args.local_rank in [-1, 0]"))
    assert codes(lint(tmp_path, select=("DPL505",))) == []
    write(tmp_path, "run.py", script.format(guard="epoch == 2"))
    assert codes(lint(tmp_path, select=("DPL505",))) == [("run.py", 9, "DPL505")]


def test_a_predicate_whose_elif_branches_all_return_holds_where_they_say(tmp_path):
    # asv-subtools: `if horovod: ... elif ddp: return rank == 0` and `return True` for one process.
    utils = """
    import torch.distributed as dist

    def use_horovod():
        return False

    def is_main_training():
        if use_horovod():
            return True
        elif dist.is_initialized():
            if dist.get_rank() == 0:
                return True
            {otherwise}
        return True
    """
    train = "import torch, torch.distributed as dist\nimport utils\n\ndist.init_process_group('nccl')\nfor epoch in range(3):\n    if utils.is_main_training():\n        torch.save({}, 'model.pt')\n"
    write(tmp_path, "utils.py", utils.format(otherwise="else:\n                return False"))
    write(tmp_path, "train.py", train)
    assert codes(lint(tmp_path, select=("DPL505",))) == []
    # Without the `else`, the other ranks fall through to `return True`.
    write(tmp_path, "utils.py", utils.format(otherwise="pass"))
    assert codes(lint(tmp_path, select=("DPL505",))) == [("train.py", 7, "DPL505")]


def test_set_epoch_in_a_function_defined_inside_the_worker_counts(tmp_path):
    # PyTorch-Encoding: `def train(epoch): train_sampler.set_epoch(epoch)` inside `main_worker`.
    script = """
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from torch.utils.data import DataLoader, DistributedSampler

    def main_worker(gpu, dataset):
        dist.init_process_group("nccl", rank=gpu, world_size=2)
        train_sampler = DistributedSampler(dataset)
        loader = DataLoader(dataset, sampler=train_sampler)

        def train(epoch):
            {set_epoch}
            for batch in loader:
                pass

        for epoch in range(10):
            train(epoch)

    if __name__ == "__main__":
        mp.spawn(main_worker, nprocs=2, args=(list(range(8)),))
    """
    write(tmp_path, "train_dist.py", script.format(set_epoch="train_sampler.set_epoch(epoch)"))
    assert codes(lint(tmp_path, select=("DPL501",))) == []
    write(tmp_path, "train_dist.py", script.format(set_epoch="pass"))
    assert codes(lint(tmp_path, select=("DPL501",))) == [("train_dist.py", 8, "DPL501")]


def test_a_program_that_builds_no_sampler_in_a_group_does_not_need_set_epoch(tmp_path):
    # DBNet, yolov7: the evaluation script calls the same loader builder in one process.
    write(tmp_path, "data.py", DATA)
    write(tmp_path, "train.py", TRAIN.format(set_epoch="loader.sampler.set_epoch(epoch)") + "\nmain(load(), build())\n")
    write(tmp_path, "eval.py", "from data import build_loader\n\nfor epoch in range(3):\n    for batch in build_loader(range(8)):\n        pass\n")
    assert codes(lint(tmp_path, select=("DPL501",))) == []
    # A second program that starts a group and never steps the sampler is still reported.
    write(tmp_path, "finetune.py", TRAIN.format(set_epoch="pass") + "\nmain(load(), build())\n")
    assert codes(lint(tmp_path, select=("DPL501",))) == [("data.py", 5, "DPL501")]


def test_a_predicate_that_calls_itself_in_its_own_condition_is_followed_a_few_calls_deep(tmp_path):
    # coremltools: a helper whose branch tests a call of itself; following it without end was a DPL000.
    write(tmp_path, "train.py", """
    import torch
    import torch.distributed as dist

    def is_leader(level=0):
        if level < 3 and is_leader(level + 1):
            return True
        return dist.get_rank() == 0

    dist.init_process_group("gloo")
    for epoch in range(3):
        if is_leader():
            dist.barrier()
        torch.save({}, "model.pt")
    """)
    # Followed to its end (the default `level=0`, then 1, 2, 3), `is_leader()` is `dist.get_rank() == 0`.
    assert codes(lint(tmp_path)) == [("train.py", 13, "DPL507"), ("train.py", 14, "DPL505")]


def test_a_parameter_passed_through_keyword_unpacking_holds_what_the_caller_put_there(tmp_path):
    # transformer-lm: `kwargs["device_id"] = i; main(**kwargs)` under spawn; `is_main = device_id in {0, None}`.
    script = """
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp

    def main(n_devices=2, device_id=None):
        is_main = device_id in {{0, None}}
        dist.init_process_group("nccl", rank=device_id, world_size=n_devices)

        def save():
            {early_exit}
            torch.save({{}}, "model.pt")

        for step in range(3):
            save()

    def _main_mp(i, kwargs):
        kwargs["device_id"] = i
        return main(**kwargs)

    if __name__ == "__main__":
        mp.spawn(_main_mp, ({{"n_devices": 2}},), 2)
    """
    write(tmp_path, "main.py", script.format(early_exit="if not is_main:\n                return"))
    assert codes(lint(tmp_path, select=("DPL505",))) == []
    write(tmp_path, "main.py", script.format(early_exit="pass"))
    assert codes(lint(tmp_path, select=("DPL505",))) == [("main.py", 12, "DPL505")]


def test_the_global_rank_from_a_copy_of_the_environment_is_not_a_gpu_index(tmp_path):
    # pytorch/examples distributed/ddp/example.py: `rank = int(env_dict["RANK"])`, then `.to(rank)` in the worker.
    script = """
    import os
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    def demo_basic(rank):
        model = torch.nn.Linear(2, 2).to(rank)
        ddp_model = DDP(model, device_ids=[rank])

    def main():
        env_dict = {key: os.environ[key] for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
        rank = int(env_dict["{variable}"])
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl")
        demo_basic(rank)

    if __name__ == "__main__":
        main()
    """
    write(tmp_path, "example.py", script.replace("{variable}", "RANK"))
    assert codes(lint(tmp_path, select=("DPL516",))) == [("example.py", 8, "DPL516"), ("example.py", 9, "DPL516"), ("example.py", 14, "DPL516")]
    write(tmp_path, "example.py", script.replace("{variable}", "LOCAL_RANK"))
    assert codes(lint(tmp_path, select=("DPL516",))) == []


def test_a_branch_of_a_helper_is_read_with_what_each_call_passes(tmp_path):
    # GroupFree3D: `save_checkpoint(..., save_cur=True)` on every rank, the periodic branch only under rank 0.
    write(tmp_path, "train.py", """
    import torch
    import torch.distributed as dist

    def save_checkpoint(state, epoch, save_cur=False):
        if save_cur:
            torch.save(state, "last.pth")
        elif epoch % 10 == 0:
            torch.save(state, f"epoch_{epoch}.pth")

    def main():
        dist.init_process_group("nccl")
        for epoch in range(100):
            if dist.get_rank() == 0:
                save_checkpoint({}, epoch)
        save_checkpoint({}, "last", save_cur=True)

    main()
    """)
    assert codes(lint(tmp_path, select=("DPL505",))) == [("train.py", 7, "DPL505")]


def test_a_rank_named_option_set_from_a_call_nothing_resolves_holds_a_rank(tmp_path):
    # Voxel-R-CNN: `total_gpus, cfg.LOCAL_RANK = getattr(common_utils, "init_dist_%s" % launcher)(...)`.
    write(tmp_path, "train.py", """
    import torch
    import torch.distributed as dist
    import common_utils

    def train_model(model, rank):
        for epoch in range(3):
            if rank == 0:
                torch.save(model.state_dict(), "checkpoint.pth")

    def main(cfg, args, model):
        dist.init_process_group("nccl")
        total_gpus, cfg.{name} = getattr(common_utils, "dist_info_%s" % args.launcher)(args.port)
        train_model(model, rank=cfg.{name})

    main(load_cfg(), parse(), build())
    """.replace("{name}", "LOCAL_RANK"))
    write(tmp_path, "common_utils.py", "import os\n\ndef dist_info_pytorch(port):\n    return 2, int(os.environ['LOCAL_RANK'])\n")
    assert codes(lint(tmp_path, select=("DPL505",))) == []
    # A name that says nothing about ranks stays what the program shows: alike on every rank.
    write(tmp_path, "train.py", (tmp_path / "train.py").read_text().replace("LOCAL_RANK", "SEED"))
    assert codes(lint(tmp_path, select=("DPL505",))) == [("train.py", 9, "DPL505")]


def test_a_sampler_built_only_when_a_caller_says_training_is_not_the_evaluation_programs(tmp_path):
    # Voxel-R-CNN: `build_dataloader(..., training=False)` in test.py builds no shuffling sampler.
    write(tmp_path, "data.py", """
    from torch.utils.data import DataLoader, DistributedSampler

    def build_dataloader(dataset, training=True):
        if training:
            sampler = DistributedSampler(dataset)
        else:
            sampler = DistributedSampler(dataset, shuffle=False)
        return DataLoader(dataset, sampler=sampler), sampler
    """)
    write(tmp_path, "train.py", "import torch.distributed as dist\nfrom data import build_dataloader\n\ndist.init_process_group('nccl')\nloader, sampler = build_dataloader(range(8))\nfor epoch in range(3):\n    sampler.set_epoch(epoch)\n    for batch in loader:\n        pass\n")
    write(tmp_path, "test.py", "import torch.distributed as dist\nfrom data import build_dataloader\n\ndist.init_process_group('nccl')\nloader, _ = build_dataloader(range(8), training={training})\nfor epoch in range(3):\n    for batch in loader:\n        model(batch).sum().backward()\n".replace("{training}", "False"))
    assert codes(lint(tmp_path, select=("DPL501",))) == []
    write(tmp_path, "test.py", (tmp_path / "test.py").read_text().replace("training=False", "training=True"))
    assert codes(lint(tmp_path, select=("DPL501",))) == [("data.py", 6, "DPL501")]


def test_a_rank_within_a_subgroup_is_not_the_global_rank(tmp_path):
    # fast-reid, vq-vae-2: `get_local_rank()` returns `dist.get_rank(group=_LOCAL_PROCESS_GROUP)`.
    write(tmp_path, "comm.py", "import torch.distributed as dist\n\n_LOCAL_PROCESS_GROUP = None\n\ndef get_local_rank():\n    return dist.get_rank({group})\n")
    write(tmp_path, "train.py", "import torch\nimport torch.distributed as dist\nimport comm\n\ndist.init_process_group('nccl')\ntorch.cuda.set_device(comm.get_local_rank())\n")
    (tmp_path / "comm.py").write_text((tmp_path / "comm.py").read_text().replace("{group}", "group=_LOCAL_PROCESS_GROUP"))
    assert codes(lint(tmp_path, select=("DPL516",))) == []
    (tmp_path / "comm.py").write_text((tmp_path / "comm.py").read_text().replace("group=_LOCAL_PROCESS_GROUP", ""))
    assert codes(lint(tmp_path, select=("DPL516",))) == [("train.py", 6, "DPL516")]


def test_a_rank_zero_decorator_holds_when_the_guard_is_read_per_call(tmp_path):
    # `@rank_zero_only` (Lightning) on a helper whose branch reads its parameter: rank 0 alone, at every call.
    write(tmp_path, "train.py", """
    import torch
    import torch.distributed as dist
    from lightning.pytorch.utilities import rank_zero_only

    {decorator}
    def save(state, final=False):
        if final:
            torch.save(state, "last.pth")

    dist.init_process_group("nccl")
    for epoch in range(3):
        save({}, final=epoch == 2)
    """.replace("{decorator}", "@rank_zero_only"))
    assert codes(lint(tmp_path, select=("DPL505",))) == []
    write(tmp_path, "train.py", (tmp_path / "train.py").read_text().replace("@rank_zero_only", ""))
    assert codes(lint(tmp_path, select=("DPL505",))) == [("train.py", 9, "DPL505")]


# the frameworks' objects: what a name holds, across files -----------------------------------------
def test_a_framework_collective_under_a_main_process_test_is_found_through_a_helper_in_another_file(tmp_path):
    write(tmp_path, "checkpoint.py", """
        def save(accelerator, model, path):
            if accelerator.is_main_process:
                accelerator.wait_for_everyone()
                accelerator.save(accelerator.unwrap_model(model).state_dict(), path)

        def sync(accelerator):
            accelerator.wait_for_everyone()
        """)  # fmt: skip
    write(tmp_path, "train.py", """
        from accelerate import Accelerator
        from checkpoint import save, sync

        def main(model):
            accelerator = Accelerator()
            model = accelerator.prepare(model)
            sync(accelerator)
            save(accelerator, model, "last.pt")

        if __name__ == "__main__":
            main(None)
        """)  # fmt: skip
    assert codes(lint(tmp_path, ("DPL507",))) == [("checkpoint.py", 4, "DPL507")]


def test_a_save_on_each_node_is_reported_where_the_program_shows_several_nodes(tmp_path):
    write(tmp_path, "options.py", """
        import argparse

        def parse():
            parser = argparse.ArgumentParser()
            parser.add_argument("--local_rank", type=int, default=0)
            NODES
            return parser.parse_args()
        """)  # fmt: skip
    write(tmp_path, "train.py", """
        import torch
        import torch.distributed as dist
        from options import parse

        def main(model):
            args = parse()
            dist.init_process_group("nccl")
            model(args).sum().backward()
            if args.local_rank == 0:
                torch.save(model.state_dict(), "last.pt")

        if __name__ == "__main__":
            main(None)
        """)  # fmt: skip
    options = (tmp_path / "options.py").read_text()
    for nodes, found in [
        ('parser.add_argument("--nnodes", type=int, default=1)', [("train.py", 11, "DPL526")]),
        ("pass  # one node: `torchrun --standalone`", []),
    ]:
        write(tmp_path, "options.py", options.replace("NODES", nodes))
        assert codes(lint(tmp_path, ("DPL526",))) == found, nodes


def test_a_flag_set_from_the_options_a_class_was_passed_guards_its_saves(tmp_path):
    # VL-T5: `self.verbose = True`, then `False` on the ranks other than 0, tested through `self.args`.
    write(tmp_path, "trainer.py", """
        import torch

        class Trainer:
            def __init__(self, args, model):
                self.args = args
                self.model = model
                self.verbose = True
                if self.args.distributed:
                    if self.args.gpu != 0:
                        self.verbose = False

            def train(self):
                for epoch in range(3):
                    if self.verbose:
                        torch.save(self.model.state_dict(), "last.pt")
        """)  # fmt: skip
    write(tmp_path, "main.py", """
        import torch.distributed as dist
        import torch.multiprocessing as mp
        from trainer import Trainer

        def main_worker(gpu, args):
            args.gpu = gpu
            if args.distributed:
                dist.init_process_group("nccl", rank=gpu, world_size=2)
            Trainer(args, None).train()

        if __name__ == "__main__":
            args = parse_args()
            mp.spawn(main_worker, args=(args,), nprocs=2)
        """)  # fmt: skip
    assert codes(lint(tmp_path, ("DPL505",))) == []
    trainer = (tmp_path / "trainer.py").read_text()
    # Replaced only where the options say so, on no rank in particular: every rank may still save.
    write(tmp_path, "trainer.py", trainer.replace("self.args.gpu != 0", "self.args.quiet"))
    assert codes(lint(tmp_path, ("DPL505",))) == [("trainer.py", 16, "DPL505")]


def test_a_saver_that_other_ranks_hold_as_a_no_op_saves_on_one_rank(tmp_path):
    # SwinBERT, VLN-DUET: the saver object is replaced by a `NoOp()` whose methods do nothing on other ranks.
    write(tmp_path, "saver.py", """
        import torch

        class Saver:
            def __init__(self, path):
                self.path = path

            def save(self, model):
                torch.save(model.state_dict(), self.path)

        class NoOp:
            def __getattr__(self, name):
                return lambda *args, **kwargs: None
        """)  # fmt: skip
    write(tmp_path, "train.py", """
        import torch.distributed as dist
        from saver import Saver, NoOp

        def main(model, restore):
            dist.init_process_group("nccl")
            HOLDER
            for step in range(10):
                saver.save(model)

        if __name__ == "__main__":
            main(None, True)
        """)  # fmt: skip
    train = (tmp_path / "train.py").read_text()
    for holder, found in [
        ("saver = Saver('last.pt') if dist.get_rank() == 0 else NoOp()", []),
        ("saver = Saver('last.pt') if restore else NoOp()", [("saver.py", 9, "DPL505")]),
        ("saver = Saver('last.pt')\n    if dist.get_rank() != 0 or not restore:\n        saver = NoOp()", []),
        ("saver = Saver('last.pt')\n    if not restore:\n        saver = NoOp()", [("saver.py", 9, "DPL505")]),
        ("saver = Saver('last.pt')", [("saver.py", 9, "DPL505")]),
    ]:
        write(tmp_path, "train.py", train.replace("HOLDER", holder))
        assert codes(lint(tmp_path, ("DPL505",))) == found, holder


def test_a_rank_zero_forward_of_a_ddp_model_is_reported_only_where_the_model_may_hold_buffers(tmp_path):
    write(tmp_path, "models.py", """
        import torch.nn as nn
        from torch.nn.utils import weight_norm

        def padding(kernel):
            return kernel // 2

        class Block(nn.Module):
            def __init__(self, h, channels):
                super().__init__()
                self.h = h  # a config, read: no module
                self.conv = weight_norm(nn.Conv1d(channels, channels, 3, padding=padding(3)))
                self.norm = nn.InstanceNorm1d(channels, affine=True)  # no running statistics

        class Other(Block):
            pass

        class Generator(nn.Module):
            def __init__(self, h):
                super().__init__()
                block = Block if h.small else Other
                self.blocks = nn.ModuleList(block(h, h.channels) for _ in range(h.layers))

            def forward(self, x):
                for layer in self.blocks:
                    x = layer(x)
                return x

        class Wrapper(nn.Module):
            def __init__(self, inner):
                super().__init__()
                self.inner = inner  # whatever module it is given

            def forward(self, x):
                return self.inner(x)
        """)  # fmt: skip
    write(tmp_path, "train.py", """
        import torch
        import torch.distributed as dist
        import torch.multiprocessing as mp
        from torch.nn.parallel import DistributedDataParallel as DDP
        from models import Generator, Wrapper

        def train(rank, h, x):
            dist.init_process_group("nccl")
            model = DDP(MODEL.to(rank), device_ids=[rank])
            model(x).sum().backward()
            if rank == 0:
                with torch.no_grad():
                    model(x)

        if __name__ == "__main__":
            mp.spawn(train, args=(None, None), nprocs=2)
        """)  # fmt: skip
    train = (tmp_path / "train.py").read_text()
    for model, found in [
        ("Generator(h)", []),
        ("Wrapper(Generator(h))", [("train.py", 14, "DPL507")]),
        ("torch.hub.load('repo', 'net')", [("train.py", 14, "DPL507")]),  # a model nobody here wrote: unknown
    ]:
        write(tmp_path, "train.py", train.replace("MODEL", model))
        assert codes(lint(tmp_path, ("DPL507",))) == found, model
    models = (tmp_path / "models.py").read_text()
    for change in [("affine=True", "affine=True, track_running_stats=True"), ("self.h = h", "self.h = h\n        self.register_buffer('step', None)")]:
        write(tmp_path, "models.py", models.replace(*change))
        write(tmp_path, "train.py", train.replace("MODEL", "Generator(h)"))
        assert codes(lint(tmp_path, ("DPL507",))) == [("train.py", 14, "DPL507")], change


def test_a_method_named_like_a_framework_collective_on_an_object_the_program_did_not_build_is_silent(tmp_path):
    write(tmp_path, "train.py", """
        import torch.distributed as dist

        class Saver:
            def save_checkpoint(self, path):
                pass

        def main(rank, saver):
            dist.init_process_group("nccl")
            if rank == 0:
                saver.save_checkpoint("last.pt")  # the project's own method: no collective
                Saver().save_checkpoint("last.pt")

        if __name__ == "__main__":
            main(0, Saver())
        """)  # fmt: skip
    assert codes(lint(tmp_path, ("DPL507",))) == []


def test_lightning_and_deepspeed_checkpoints_saved_on_rank_zero_only_hang(tmp_path):
    write(tmp_path, "fit.py", """
        import deepspeed
        import pytorch_lightning as pl

        def lightning(module):
            trainer = pl.Trainer(accelerator="gpu", devices=2, strategy="ddp")
            trainer.fit(module)
            if trainer.is_global_zero:
                trainer.save_checkpoint("final.ckpt")

        def ds(args, model):
            engine, _, _, _ = deepspeed.initialize(args=args, model=model)
            if engine.global_rank == 0:
                engine.save_checkpoint(args.out)
            engine.save_checkpoint(args.out)
        """)  # fmt: skip
    assert codes(lint(tmp_path, ("DPL507",))) == [("fit.py", 9, "DPL507"), ("fit.py", 14, "DPL507")]


def test_an_optimizer_from_a_factory_in_another_file_stepped_inside_no_sync(tmp_path):
    write(tmp_path, "optim.py", """
        import torch

        def build_optimizer(model, lr):
            return torch.optim.AdamW(model.parameters(), lr=lr)
        """)  # fmt: skip
    write(tmp_path, "train.py", """
        from optim import build_optimizer

        def train(model, loader, external_optimizer):
            optimizer = build_optimizer(model, 1e-4)
            for step, x in enumerate(loader):
                with model.no_sync():
                    model(x).sum().backward()
                    if step % 4 == 3:
                        optimizer.step()
                        external_optimizer.step()  # not known to be an optimizer: silent
        """)  # fmt: skip
    assert codes(lint(tmp_path, ("DPL517",))) == [("train.py", 10, "DPL517")]


# what a name holds: defaults, decorators, imports ---------------------------------------
def test_a_predicate_called_without_its_defaulted_argument_reads_the_default(tmp_path):
    write(tmp_path, "dist_utils.py", """
        def should_save(args, every_rank=False):
            return True if every_rank else args.rank == 0
        """)  # fmt: skip
    write(tmp_path, "train.py", """
        import os
        import torch
        import torch.distributed as dist
        from dist_utils import should_save

        def main(args, state):
            args.rank = int(os.environ["RANK"])
            dist.init_process_group("nccl")
            if should_save(args):
                torch.save(state, "best.pt")
            if should_save(args, every_rank=True):
                torch.save(state, "last.pt")
        """)  # fmt: skip
    assert codes(lint(tmp_path, ("DPL505",))) == [("train.py", 13, "DPL505")]


def test_a_projects_decorator_runs_the_function_where_its_wrapper_calls_it(tmp_path):
    write(tmp_path, "dist_utils.py", """
        import functools
        import torch.distributed as dist

        def main_process(func):
            @functools.wraps(func)
            def wrapper(*args, **kwargs):
                if dist.get_rank() == 0:
                    return func(*args, **kwargs)
            return wrapper

        def timed(func):
            def wrapper(*args, **kwargs):
                return func(*args, **kwargs)
            return wrapper
        """)  # fmt: skip
    write(tmp_path, "train.py", """
        import torch
        import torch.distributed as dist
        from dist_utils import main_process, timed

        @main_process
        def save_best(state):
            torch.save(state, "best.pt")

        @timed
        def save_last(state):
            torch.save(state, "last.pt")

        def main(state):
            dist.init_process_group("nccl")
            save_best(state)
            save_last(state)
        """)  # fmt: skip
    assert codes(lint(tmp_path, ("DPL505",))) == [("train.py", 12, "DPL505")]


def test_an_absolute_import_inside_a_package_is_not_the_packages_own_folder_of_that_name(tmp_path):
    write(tmp_path, "pkg/__init__.py", "")
    write(tmp_path, "pkg/trainer/__init__.py", "")
    write(tmp_path, "pkg/trainer/ray/__init__.py", "import torch\n")
    write(tmp_path, "pkg/trainer/ray/engine.py", """
        import os
        import ray

        def start():
            os.environ["CUDA_VISIBLE_DEVICES"] = str(ray.get_gpu_ids()[0])
        """)  # fmt: skip
    assert codes(lint(tmp_path, ("DPL2",))) == []  # `import ray` is the library, which does not import torch


def test_a_wrap_of_an_object_that_is_no_module_wraps_nothing(tmp_path):
    # TorchSSL: `model = FixMatch(net, ...)` holds the network in `model.model`; `DDP(model)` on the
    # algorithm object raises, so `model` is never the wrapper where its attributes are read.
    write(tmp_path, "fixmatch.py", """
        class FixMatch:
            def __init__(self, net):
                self.model = net
                self.it = 0

            def set_data_loader(self, loaders):
                self.loaders = loaders
        """)  # fmt: skip
    write(tmp_path, "train.py", """
        import copy
        import torch.nn as nn
        from torch.nn.parallel import DistributedDataParallel as DDP
        from fixmatch import FixMatch

        def main(args, net):
            model = FixMatch(net)
            if args.gpu is not None:
                model.model = DDP(model.model, device_ids=[args.gpu])
            else:
                model = DDP(model)
            ema = copy.deepcopy(model.model)
            model.set_data_loader({})
            wrapped = nn.DataParallel(Net())
            return wrapped.fc

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(2, 2)
        """)  # fmt: skip
    assert codes(lint(tmp_path, ("DPL302",))) == [("train.py", 16, "DPL302")]


def test_a_function_reached_through_a_star_import_is_in_the_program(tmp_path):
    # l2p-pytorch: `from engine import *`, and `train_one_epoch` in engine.py calls `set_epoch`.
    write(tmp_path, "data.py", DATA)
    write(tmp_path, "engine.py", """
        def train_one_epoch(loader, model, epoch):
            loader.sampler.set_epoch(epoch)
            for x, y in loader:
                model(x).sum().backward()
        """)  # fmt: skip
    write(tmp_path, "main.py", """
        import torch.distributed as dist
        from data import build_loader
        from engine import *

        def main(dataset, model):
            dist.init_process_group("gloo")
            loader = build_loader(dataset)
            for epoch in range(10):
                train_one_epoch(loader, model, epoch)

        if __name__ == "__main__":
            main(None, None)
        """)  # fmt: skip
    assert codes(lint(tmp_path, ("DPL501",))) == []


def test_a_class_whose_base_resolves_to_itself_is_read_once(tmp_path):
    # ibot: two `mmcv_custom/register_backbone.py` define `class VisionTransformer(VisionTransformer)`.
    write(tmp_path, "backbone.py", """
        import torch.distributed as dist
        from backbone import Trainer

        class Trainer(Trainer):
            def step(self):
                if self.is_master:
                    dist.barrier()

        def main():
            dist.init_process_group("gloo")
            Trainer().step()

        if __name__ == "__main__":
            main()
        """)  # fmt: skip
    result = lint(tmp_path, ("DPL",))
    assert [f.code for f in result.findings if f.code == "DPL000"] == [] and not result.internal_errors


def test_two_scripts_of_one_name_in_different_folders_keep_their_own_locals(tmp_path: Path) -> None:
    # Both scripts are module `train`; the DDP script's `trainer` (a project class) must not become the
    # Lightning script's, whose rank-0-only `save_checkpoint` would then go unseen.
    (tmp_path / "pyproject.toml").write_text("")
    write(tmp_path, "ddp/engine.py", "class Trainer:\n    def __init__(self, model):\n        self.model = model\n")
    write(
        tmp_path,
        "ddp/train.py",
        """
        import torch.distributed as dist
        from engine import Trainer

        def main(model):
            dist.init_process_group("nccl")
            trainer = Trainer(model)
            if dist.get_rank() == 0:
                print(trainer)

        if __name__ == "__main__":
            main(None)
        """,
    )
    write(
        tmp_path,
        "lit/train.py",
        """
        import lightning as L

        def main(model):
            trainer = L.Trainer(accelerator="gpu", devices=2, strategy="ddp")
            trainer.fit(model)
            if trainer.is_global_zero:
                trainer.save_checkpoint("last.ckpt")

        if __name__ == "__main__":
            main(None)
        """,
    )
    assert codes(lint(tmp_path, ("DPL507",))) == [("lit/train.py", 8, "DPL507")]


# DPL518: a backward or step around the Accelerator or the DeepSpeed engine ------------------------------
def test_a_backward_in_another_file_that_receives_the_prepared_accelerator_bypasses_it(tmp_path):
    write(tmp_path, "main.py", """
        import torch
        from accelerate import Accelerator
        from loop import train

        def main():
            accelerator = Accelerator(mixed_precision="fp16")
            model = torch.nn.Linear(2, 2)
            optimizer = torch.optim.AdamW(model.parameters())
            model, optimizer = accelerator.prepare(model, optimizer)
            train(accelerator, model, optimizer, [])

        if __name__ == "__main__":
            main()
        """)  # fmt: skip
    write(tmp_path, "loop.py", """
        def train(accelerator, model, optimizer, loader):
            for x in loader:
                loss = model(x).sum()
                loss.backward()
                optimizer.step()

        def plain(model, loader):
            for x in loader:
                model(x).sum().backward()  # no accelerator in view
        """)  # fmt: skip
    assert codes(lint(tmp_path, ("DPL518",))) == [("loop.py", 5, "DPL518")]


def test_the_other_branch_of_an_optional_accelerator_and_a_program_that_prepares_nothing_are_silent(tmp_path):
    write(tmp_path, "optional.py", """
        import torch
        from accelerate import Accelerator

        def main(args):
            accelerator = Accelerator()
            model = torch.nn.Linear(2, 2)
            optimizer = torch.optim.AdamW(model.parameters())
            model, optimizer = accelerator.prepare(model, optimizer)
            for x in []:
                loss = model(x).sum()
                if accelerator is not None:
                    accelerator.backward(loss)
                else:
                    loss.backward()
                if not accelerator:
                    loss.backward()

        if __name__ == "__main__":
            main(None)
        """)  # fmt: skip
    write(tmp_path, "unprepared.py", """
        import torch
        from accelerate import Accelerator

        def main():
            accelerator = Accelerator()
            model = torch.nn.Linear(2, 2)
            for x in []:
                model(x).sum().backward()
                accelerator.print("step")

        if __name__ == "__main__":
            main()
        """)  # fmt: skip
    assert codes(lint(tmp_path, ("DPL518",))) == []


def test_a_deepspeed_trainer_steps_the_optimizer_it_passed_to_the_engine(tmp_path):
    write(tmp_path, "trainer.py", """
        import torch
        import deepspeed

        class Trainer:
            def __init__(self, args, model):
                self.optimizer = torch.optim.AdamW(model.parameters())
                self.engine, _, _, _ = deepspeed.initialize(args=args, model=model, optimizer=self.optimizer)

            def train_step(self, x, use_engine):
                loss = self.engine(x).loss
                if use_engine:
                    self.engine.backward(loss)
                    self.engine.step()
                else:
                    loss.backward()
                    self.optimizer.step()
                self.optimizer.step()
        """)  # fmt: skip
    write(tmp_path, "main.py", """
        from trainer import Trainer

        if __name__ == "__main__":
            Trainer(None, None).train_step(1, True)
        """)  # fmt: skip
    assert codes(lint(tmp_path, ("DPL518",))) == [("trainer.py", 18, "DPL518")]


# DPL522: `accelerator.gather` where `gather_for_metrics` is meant --------------------------------------
def test_an_evaluation_loop_in_another_file_gathers_rows_of_a_prepared_loader(tmp_path):
    write(tmp_path, "main.py", """
        from accelerate import Accelerator
        from torch.utils.data import DataLoader
        from evaluation import evaluate

        def main():
            accelerator = Accelerator()
            train_loader = DataLoader(train_set, batch_size=32, shuffle=True)
            val_loader = DataLoader(val_set, batch_size=32)
            model, optimizer, train_loader, val_loader = accelerator.prepare(model, optimizer, train_loader, val_loader)
            for batch in train_loader:
                accelerator.backward(model(batch["x"]).loss)
                optimizer.step()
                labels = accelerator.gather(batch["y"])  # a training loop: not a metric over the dataset
            print(evaluate(accelerator, model, val_loader))

        if __name__ == "__main__":
            main()
        """)  # fmt: skip
    write(tmp_path, "evaluation.py", """
        import torch

        def evaluate(accelerator, model, loader):
            hits, seen = 0, 0
            for batch in loader:
                with torch.no_grad():
                    predictions = model(batch["x"]).logits.argmax(-1)
                predictions, labels = accelerator.gather((predictions, batch["y"]))
                hits += (predictions == labels).sum().item()
                seen += labels.numel()
                accelerator.print(accelerator.gather(model(batch["x"]).loss).mean())
            return hits / seen
        """)  # fmt: skip
    assert codes(lint(tmp_path, ("DPL522",))) == [("evaluation.py", 9, "DPL522")]


def test_gathers_whose_rows_are_truncated_or_whose_loader_drops_its_last_batch_are_silent(tmp_path):
    write(tmp_path, "truncated.py", """
        import torch
        from accelerate import Accelerator
        from torch.utils.data import DataLoader

        def main():
            accelerator = Accelerator()
            eval_loader = accelerator.prepare(DataLoader(eval_set, batch_size=16))
            losses = []
            for batch in eval_loader:
                losses.append(accelerator.gather(model(**batch).loss.reshape(1).expand(16)))
                predictions = accelerator.gather(model(**batch).logits)
                if accelerator.gradient_state.end_of_dataloader:
                    predictions = predictions[: accelerator.gradient_state.remainder]
            losses = torch.cat(losses)[: len(eval_set)]

        if __name__ == "__main__":
            main()
        """)  # fmt: skip
    write(tmp_path, "drop_last.py", """
        from accelerate import Accelerator
        from torch.utils.data import DataLoader

        def main():
            accelerator = Accelerator()
            eval_loader = accelerator.prepare(DataLoader(eval_set, batch_size=16, drop_last=True))
            for batch in eval_loader:
                metric.add_batch(predictions=accelerator.gather(model(**batch).logits.argmax(-1)), references=accelerator.gather(batch["labels"]))

        if __name__ == "__main__":
            main()
        """)  # fmt: skip
    write(tmp_path, "even.py", """
        from accelerate import Accelerator
        from torch.utils.data import DataLoader

        def main():
            accelerator = Accelerator()
            accelerator.even_batches = False
            eval_loader = accelerator.prepare(DataLoader(eval_set, batch_size=16))
            for batch in eval_loader:
                metric.add_batch(predictions=accelerator.gather(model(**batch).logits.argmax(-1)), references=accelerator.gather(batch["labels"]))

        if __name__ == "__main__":
            main()
        """)  # fmt: skip
    assert codes(lint(tmp_path, ("DPL522",))) == []


# DPL523: an epoch-level `self.log` without `sync_dist=True` under a multi-process Trainer ------------------
_LIGHTNING_MODULE = """
    import torch
    import torch.nn.functional as F
    import torchmetrics
    from lightning.pytorch import LightningModule

    class Classifier(LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(8, 4)
            self.accuracy = torchmetrics.Accuracy(task="multiclass", num_classes=4)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = F.cross_entropy(self.net(x), y)
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            loss = F.cross_entropy(self.net(x), y)
            self.accuracy(self.net(x), y)
            self.log("val_acc", self.accuracy)
            self.log("val_loss", loss)
            self.log("val_loss_per_step", loss, on_step=True, on_epoch=False)
    """


def test_a_lightning_module_logs_an_unsynced_epoch_value_for_a_trainer_of_another_file(tmp_path):
    write(tmp_path, "model.py", _LIGHTNING_MODULE)
    write(tmp_path, "train.py", """
        import lightning.pytorch as pl
        from model import Classifier

        if __name__ == "__main__":
            pl.Trainer(accelerator="gpu", devices=2, max_epochs=3).fit(Classifier())
        """)  # fmt: skip
    assert codes(lint(tmp_path, ("DPL523",))) == [("model.py", 24, "DPL523")]


def test_a_lightning_module_under_a_trainer_of_unknown_or_single_device_is_silent(tmp_path):
    write(tmp_path, "model.py", _LIGHTNING_MODULE)
    write(tmp_path, "train.py", """
        import argparse
        import lightning.pytorch as pl
        from model import Classifier

        def main():
            args = argparse.ArgumentParser().parse_args()
            pl.Trainer(accelerator="gpu", devices=args.devices).fit(Classifier())
            pl.Trainer(devices=1).test(Classifier())

        if __name__ == "__main__":
            main()
        """)  # fmt: skip
    assert codes(lint(tmp_path, ("DPL523",))) == []


# DPL519: the local rank passed where torch wants the global rank -----------------------------------------


def test_the_local_rank_from_argparse_is_not_the_rank_of_the_group_or_the_sampler(tmp_path):
    # torch.distributed.launch's `--local_rank`, passed to the group and the sampler (pytorch/pytorch#23074).
    script = """
    import argparse
    import torch.distributed as dist
    from torch.utils.data.distributed import DistributedSampler

    def main():
        parser = argparse.ArgumentParser()
        parser.add_argument("--local_rank", type=int, default=0)
        args = parser.parse_args()
        dist.init_process_group("nccl", init_method="env://", world_size=dist_world(), rank={rank})
        return DistributedSampler(range(10), num_replicas=dist.get_world_size(), rank={sampler_rank})

    if __name__ == "__main__":
        main()
    """
    write(tmp_path, "train.py", script.format(rank="args.local_rank", sampler_rank="args.local_rank"))
    assert codes(lint(tmp_path, select=("DPL519",))) == [("train.py", 10, "DPL519"), ("train.py", 11, "DPL519")]
    # The global rank, from the environment and from the group: silent.
    write(tmp_path, "train.py", script.format(rank='int(os.environ["RANK"])', sampler_rank="dist.get_rank()").replace("import argparse", "import argparse, os"))
    assert codes(lint(tmp_path, select=("DPL519",))) == []
    # A rank computed from the node's index and the local rank: silent.
    write(tmp_path, "train.py", script.format(rank="args.node_rank * 8 + args.local_rank", sampler_rank="args.node_rank * 8 + args.local_rank"))
    assert codes(lint(tmp_path, select=("DPL519",))) == []


def test_a_group_of_the_nodes_gpus_or_on_the_loopback_address_is_one_node(tmp_path):
    # BiSeNet's trainer: `world_size=torch.cuda.device_count()` at `tcp://127.0.0.1`, launched per GPU.
    script = """
    import argparse
    import torch
    import torch.distributed as dist

    def train():
        parser = argparse.ArgumentParser()
        parser.add_argument("--local_rank", dest="local_rank", type=int, default=-1)
        args = parser.parse_args()
        torch.cuda.set_device(args.local_rank)
        world_size = {size}
        dist.init_process_group(backend="nccl", init_method={method}, world_size=world_size, rank=args.local_rank)

    if __name__ == "__main__":
        train()
    """
    write(tmp_path, "train.py", script.format(size="torch.cuda.device_count()", method='"env://"'))
    assert codes(lint(tmp_path, select=("DPL519",))) == []
    write(tmp_path, "train.py", script.format(size="args.world_size", method="'tcp://127.0.0.1:{}'.format(args.port)"))
    assert codes(lint(tmp_path, select=("DPL519",))) == []
    write(tmp_path, "train.py", script.format(size="args.world_size", method='f"tcp://{args.master}:{args.port}"'))
    assert codes(lint(tmp_path, select=("DPL519",))) == [("train.py", 12, "DPL519")]
    # mochi's workers: `os.environ["MASTER_ADDR"] = "127.0.0.1"` before the environment's rendezvous.
    on_this_host = script.replace("world_size = {size}", 'os.environ["MASTER_ADDR"] = {address}').replace("import argparse", "import argparse, os")
    write(tmp_path, "train.py", on_this_host.format(address='"127.0.0.1"', method='"env://"').replace("world_size=world_size", "world_size=args.world_size"))
    assert codes(lint(tmp_path, select=("DPL519",))) == []
    write(tmp_path, "train.py", on_this_host.format(address="args.master", method='"env://"').replace("world_size=world_size", "world_size=args.world_size"))
    assert codes(lint(tmp_path, select=("DPL519",))) == [("train.py", 12, "DPL519")]


def test_a_spawn_is_one_node_where_it_starts_the_whole_group(tmp_path):
    # The DDP tutorial: `run_demo(demo_basic, world_size)` spawns `world_size` processes, a group of `world_size`.
    script = """
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from torch.utils.data.distributed import DistributedSampler

    def setup(rank, world_size):
        dist.init_process_group("gloo", rank=rank, world_size=world_size)

    def demo_basic(rank, world_size):
        setup(rank, world_size)
        sampler = DistributedSampler(range(10), num_replicas=world_size, rank=rank)

    def run_demo(demo_fn, world_size, procs, nodes=2):
        mp.spawn(demo_fn, args=(world_size,), nprocs=procs, join=True)

    if __name__ == "__main__":
        n_gpus = torch.cuda.device_count()
        run_demo(demo_basic, {world}, n_gpus)
    """
    write(tmp_path, "ddp.py", script.replace("nprocs=procs", "nprocs=world_size").format(world="n_gpus"))
    assert codes(lint(tmp_path, select=("DPL519",))) == []
    # A group of an unknown size: the process index may well be the global rank; silent.
    write(tmp_path, "ddp.py", script.format(world="n_gpus"))
    assert codes(lint(tmp_path, select=("DPL519",))) == []
    # Spawned per node into a group of `nodes` times as many: the process index is no global rank.
    write(tmp_path, "ddp.py", script.replace("args=(world_size,), nprocs=procs", "args=(procs * nodes,), nprocs=procs").format(world="n_gpus"))
    assert codes(lint(tmp_path, select=("DPL519",))) == [("ddp.py", 8, "DPL519"), ("ddp.py", 12, "DPL519")]


def test_a_spawn_per_node_with_the_rank_computed_from_the_node_is_silent(tmp_path):
    # The multi-node mp.spawn tutorial: `rank = args.nr * args.gpus + gpu` in the group, `gpu` for the device.
    script = """
    import argparse
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp

    def train(gpu, args):
        rank = {rank}
        dist.init_process_group(backend="nccl", init_method="env://", world_size=args.world_size, rank=rank)
        torch.cuda.set_device(gpu)

    def main():
        parser = argparse.ArgumentParser()
        parser.add_argument("-n", "--nodes", default=1, type=int)
        parser.add_argument("-g", "--gpus", default=1, type=int)
        parser.add_argument("-nr", "--nr", default=0, type=int)
        args = parser.parse_args()
        args.world_size = args.gpus * args.nodes
        mp.spawn(train, nprocs=args.gpus, args=(args,))

    if __name__ == "__main__":
        main()
    """
    write(tmp_path, "train.py", script.format(rank="args.nr * args.gpus + gpu"))
    assert codes(lint(tmp_path, select=("DPL519", "DPL516"))) == []
    write(tmp_path, "train.py", script.format(rank="gpu"))
    assert codes(lint(tmp_path, select=("DPL519", "DPL516"))) == [("train.py", 9, "DPL519")]


def test_the_local_rank_of_torchrun_through_the_cli(tmp_path):
    write(tmp_path, "train.py", """
        import os
        import torch.distributed as dist

        local_rank = int(os.environ["LOCAL_RANK"])
        dist.init_process_group("nccl", rank=local_rank, world_size=int(os.environ["WORLD_SIZE"]))
        """)  # fmt: skip
    run = subprocess.run(
        [sys.executable, "-m", "dplint", "--preview", "--select", "DPL519", "--format", "concise", "--no-cache", "train.py"],
        cwd=tmp_path, capture_output=True, text=True,
    )  # fmt: skip
    assert "train.py:6:38: DPL519 `rank=` gets the local rank: on a second node two processes claim each global rank." in run.stdout
    assert run.returncode == 1


def test_a_vendored_torch_library_calling_a_star_imported_name_under_a_rank_test_is_linted(tmp_path):
    # A copy of DeepSpeed inside the project is a torch library: the execution model holds no summary of
    # its files, so a star-imported name called in a rank test resolves to nothing (it raised KeyError).
    write(tmp_path, "deepspeed/__init__.py", "")
    write(tmp_path, "deepspeed/runtime/__init__.py", "")
    write(tmp_path, "deepspeed/runtime/helpers.py", "def see_memory_usage(message):\n    print(message)\n")
    write(tmp_path, "deepspeed/runtime/offload.py", """
        import torch.distributed as dist
        from deepspeed.runtime.helpers import *

        def setup(param):
            if dist.get_rank() == 0 and not see_memory_usage(param):
                dist.barrier()
        """)  # fmt: skip
    result = lint(tmp_path, ("DPL507",))
    assert not result.internal_errors
    assert codes(result) == [("deepspeed/runtime/offload.py", 7, "DPL507")]


# DPL524: a full FSDP state dict taken without CPU offload ------------------------------------------------
def test_a_full_fsdp_state_dict_without_cpu_offload_is_reported_where_it_is_set_up(tmp_path):
    write(tmp_path, "checkpointing.py", """
        import torch
        import torch.distributed as dist
        from torch.distributed.fsdp import FullStateDictConfig, StateDictType
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        def save_model_checkpoint(model, rank, path):
            save_policy = FullStateDictConfig(rank0_only=True)
            with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, save_policy):
                cpu_state = model.state_dict()
            if rank == 0:
                torch.save(cpu_state, path)

        def consolidate(model, path):
            FSDP.set_state_dict_type(model, state_dict_type=StateDictType.FULL_STATE_DICT)
            state = model.state_dict()
            if dist.get_rank() == 0:
                torch.save(state, path)
        """)  # fmt: skip
    write(tmp_path, "dcp.py", """
        import torch
        import torch.distributed as dist
        from torch.distributed.checkpoint import state_dict as dsd

        def save(model, optimizer, path):
            model_state, optim_state = dsd.get_state_dict(model, optimizer, options=dsd.StateDictOptions(full_state_dict=True, cpu_offload=False))
            if dist.get_rank() == 0:
                torch.save({"model": model_state, "optim": optim_state}, path)
        """)  # fmt: skip
    result = lint(tmp_path, ("DPL524",))
    assert codes(result) == [("checkpointing.py", 9, "DPL524"), ("checkpointing.py", 15, "DPL524"), ("dcp.py", 7, "DPL524")]
    messages = [f.message for f in sorted(result.findings, key=lambda f: (f.path, f.location.row))]
    assert messages == [
        "`FULL_STATE_DICT` without `offload_to_cpu=True`: `state_dict()` gathers the whole model into rank 0's GPU memory.",
        "`FULL_STATE_DICT` without `offload_to_cpu=True`: `state_dict()` gathers the whole model into every rank's GPU memory.",
        "`full_state_dict=True` without `cpu_offload=True`: every rank gathers the whole model and optimizer state into its GPU memory.",
    ]


def test_a_full_fsdp_state_dict_offloaded_sharded_or_with_options_not_in_view_is_silent(tmp_path):
    # llama-recipes' layout: the policy is a module-level constant, offloaded and rank 0 only.
    write(tmp_path, "checkpointing.py", """
        import torch
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        from torch.distributed.fsdp import FullStateDictConfig, StateDictType
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        fullstate_save_policy = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)

        def save_model_checkpoint(model, rank, path):
            with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, fullstate_save_policy):
                cpu_state = model.state_dict()
            if rank == 0:
                torch.save(cpu_state, path)

        def save_sharded(model, path):
            with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
                dcp.save({"model": model.state_dict()}, checkpoint_id=path)

        def save_configured(model, path, state_dict_config, **kwargs):
            with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, state_dict_config):
                state = model.state_dict()
            with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, **kwargs):
                state = model.state_dict()
            config = FullStateDictConfig(offload_to_cpu=kwargs["offload"], rank0_only=True)
            with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, config):
                state = model.state_dict()
            return state
        """)  # fmt: skip
    # Loading a full state dict unshards one FSDP unit at a time (verl's layout: the state dict read inside
    # is the unsharded reference model's); the setter's type is set for a state dict another function takes.
    write(tmp_path, "loading.py", """
        import torch
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, StateDictType

        class Worker:
            def load_reference(self, reference):
                with FSDP.state_dict_type(self.original_model, StateDictType.FULL_STATE_DICT):
                    self.original_model.load_state_dict(reference.state_dict(), strict=True)

            def prepare(self):
                FSDP.set_state_dict_type(self.model, StateDictType.FULL_STATE_DICT)
                self.model.load_state_dict(torch.load("init.pt", map_location="cpu"))
        """)  # fmt: skip
    write(tmp_path, "dcp.py", """
        import torch
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_state_dict

        def save_full(model, optimizer, path):
            options = StateDictOptions(full_state_dict=True, cpu_offload=True)
            model_state, optim_state = get_state_dict(model, optimizer, options=options)
            if dist.get_rank() == 0:
                torch.save({"model": model_state, "optim": optim_state}, path)

        def save_sharded(model, path):
            dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=path)
            dcp.save({"model": get_model_state_dict(model, options=StateDictOptions(cpu_offload=True))}, checkpoint_id=path)

        def snapshot(model, options, offload):
            full = get_model_state_dict(model, options=options)
            if offload:
                chosen = StateDictOptions(full_state_dict=True, cpu_offload=True)
            else:
                chosen = StateDictOptions(full_state_dict=True, cpu_offload=False)
            return full, get_model_state_dict(model, options=chosen)
        """)  # fmt: skip
    assert codes(lint(tmp_path, ("DPL524",))) == []


NESTED_EARLY_RETURN = """
import torch
import torch.distributed as dist


def save_checkpoint(model):
    if dist.is_initialized():
        if {test}:
            return
    torch.save(model.state_dict(), "ckpt.pt")


def main():
    dist.init_process_group("nccl")
    save_checkpoint(torch.nn.Linear(2, 2))


if __name__ == "__main__":
    main()
"""


def test_an_early_return_nested_under_the_mode_test_leaves_the_save_to_rank_zero(tmp_path):
    # metta's pufferl: `if is_initialized(): if get_rank() != 0: return`, then the save.
    write(tmp_path, "train.py", NESTED_EARLY_RETURN.format(test="dist.get_rank() != 0"))
    assert codes(lint(tmp_path, select=("DPL505",))) == []
    # A test that holds on no rank leaves every rank to save.
    write(tmp_path, "train.py", NESTED_EARLY_RETURN.format(test="dist.get_rank() < 0"))
    assert codes(lint(tmp_path, select=("DPL505",))) == [("train.py", 10, "DPL505")]


# DPL525: gradient accumulation on a DDP model without no_sync -------------------------------------------
def test_accumulation_on_a_model_wrapped_in_another_file_without_no_sync_is_advice(tmp_path):
    # The wrap is in main.py; the loop receives the wrapper as a parameter and steps every 4th micro-batch.
    write(tmp_path, "engine.py", """
        import torch

        def train_one_epoch(model, optimizer, loader, accumulation):
            model.train()
            for step, (x, y) in enumerate(loader):
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                if (step + 1) % accumulation == 0:
                    optimizer.step()
                    optimizer.zero_grad()
                if step % 100 == 0:
                    print(loss.item())
        """)  # fmt: skip
    write(tmp_path, "main.py", """
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel
        from engine import train_one_epoch

        def main(args, model, loader):
            dist.init_process_group("nccl")
            model = DistributedDataParallel(model.cuda(), device_ids=[args.local_rank])
            optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
            for epoch in range(args.epochs):
                train_one_epoch(model, optimizer, loader, args.accumulation)
        """)  # fmt: skip
    result = lint(tmp_path, ("DPL525",))
    assert codes(result) == [("engine.py", 8, "DPL525")]
    (finding,) = result.findings
    assert finding.severity == "warning"
    assert finding.message == (
        "Every accumulation micro-step's `backward()` all-reduces the DDP gradients; only the one that steps needs to."
    )
    assert "model.no_sync()" in finding.help and "contextlib.nullcontext()" in finding.help


def test_accumulation_with_no_sync_every_step_or_without_ddp_is_silent(tmp_path):
    write(tmp_path, "no_sync.py", """
        import torch
        from torch.nn.parallel import DistributedDataParallel

        def train(model, loader, accumulation, rank):
            model = DistributedDataParallel(model, device_ids=[rank])
            optimizer = torch.optim.AdamW(model.parameters())
            for step, x in enumerate(loader):
                if (step + 1) % accumulation != 0:
                    with model.no_sync():
                        model(x).sum().backward()
                else:
                    model(x).sum().backward()
                    optimizer.step()
                    optimizer.zero_grad()
        """)  # fmt: skip
    write(tmp_path, "manual_flag.py", """
        import torch
        from torch.nn.parallel import DistributedDataParallel

        def train(model, loader, accumulation, rank):
            model = DistributedDataParallel(model, device_ids=[rank])
            optimizer = torch.optim.AdamW(model.parameters())
            for step, x in enumerate(loader):
                model.require_backward_grad_sync = (step + 1) % accumulation == 0  # what no_sync() toggles
                model(x).sum().backward()
                if (step + 1) % accumulation == 0:
                    optimizer.step()
        """)  # fmt: skip
    write(tmp_path, "every_step.py", """
        import torch
        from torch.nn.parallel import DistributedDataParallel

        def train(model, loader, rank, log_every):
            model = DistributedDataParallel(model, device_ids=[rank])
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for step, x in enumerate(loader):
                loss = model(x).sum()
                loss.backward()
                optimizer.step()
                if step % log_every == 0:  # a modulo, but not around the step
                    print(loss.item())
        """)  # fmt: skip
    write(tmp_path, "single_process.py", """
        import torch

        def train(model, loader, accumulation):
            if torch.cuda.device_count() > 1:
                model = torch.nn.DataParallel(model)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for step, x in enumerate(loader):
                model(x).sum().backward()
                if (step + 1) % accumulation == 0:
                    optimizer.step()
        """)  # fmt: skip
    write(tmp_path, "accelerated.py", """
        import torch
        from accelerate import Accelerator

        def train(model, loader, accumulation):
            accelerator = Accelerator()
            optimizer = torch.optim.AdamW(model.parameters())
            model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
            for step, x in enumerate(loader):
                accelerator.backward(model(x).sum())
                if (step + 1) % accumulation == 0:
                    optimizer.step()
                    optimizer.zero_grad()
        """)  # fmt: skip
    assert codes(lint(tmp_path, ("DPL525",))) == []


def test_accumulation_without_no_sync_is_preview_only_on_the_cli(tmp_path):
    write(tmp_path, "train.py", """
        import torch
        from torch.nn.parallel import DistributedDataParallel

        def train(model, loader, accumulation, rank):
            model = DistributedDataParallel(model, device_ids=[rank])
            optimizer = torch.optim.AdamW(model.parameters())
            for step, x in enumerate(loader):
                model(x).sum().backward()
                if (step + 1) % accumulation == 0:
                    optimizer.step()
        """)  # fmt: skip
    command = [sys.executable, "-m", "dplint", "--no-cache", "--select", "DPL525", "--format", "concise", "train.py"]
    stable = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True)
    preview = subprocess.run([*command, "--preview"], cwd=tmp_path, capture_output=True, text=True)
    assert "DPL525" not in stable.stdout
    assert "train.py:9:" in preview.stdout and "DPL525" in preview.stdout


def test_accumulation_reported_on_the_backward_whose_next_step_accumulates(tmp_path):
    # A GAN loop (whisper-vits-svc's shape): the generator accumulates, the discriminator steps every batch.
    write(tmp_path, "train.py", """
        import torch
        from torch.nn.parallel import DistributedDataParallel

        def train(rank, hp, model_g, model_d, loader):
            model_g = DistributedDataParallel(model_g, device_ids=[rank])
            model_d = DistributedDataParallel(model_d, device_ids=[rank])
            optim_g = torch.optim.AdamW(model_g.parameters())
            optim_d = torch.optim.AdamW(model_d.parameters())
            for step, (x, y) in enumerate(loader):
                fake = model_g(x)
                loss_g = (model_d(fake) - 1).pow(2).mean()
                loss_g.backward()
                if (step + 1) % hp.accum_step == 0 or step + 1 == len(loader):
                    optim_g.step()
                    optim_g.zero_grad()
                optim_d.zero_grad()
                loss_d = model_d(fake.detach()).pow(2).mean() + (model_d(y) - 1).pow(2).mean()
                loss_d.backward()
                optim_d.step()
        """)  # fmt: skip
    assert codes(lint(tmp_path, ("DPL525",))) == [("train.py", 13, "DPL525")]


def test_a_load_of_a_file_the_project_writes_only_from_the_cpu_needs_no_map_location(tmp_path):
    write(
        tmp_path,
        "train.py",
        """
        import argparse, os
        import torch
        import torch.distributed as dist

        def main(args, model):
            dist.init_process_group("nccl")
            torch.save(args, os.path.join(args.out, "model_args.pth"))  # the parsed options
            torch.save((torch.cuda.get_rng_state(), torch.get_rng_state()), f"{args.out}/rng.pt")
            with open(os.path.join(args.out, "weights.pt"), "wb") as f:
                torch.save({k: v.cpu() for k, v in model.state_dict().items()}, f)
            torch.save(model.state_dict(), os.path.join(args.out, "last.pt"))  # on the GPU

        if __name__ == "__main__":
            args = argparse.ArgumentParser().parse_args()
            main(args, build())
        """,
    )
    write(
        tmp_path,
        "sample.py",
        """
        import os
        import torch
        import torch.distributed as dist

        def run(args, model):
            dist.init_process_group("nccl")
            model.cuda()
            train_args = torch.load(os.path.join(args.ckpt, "model_args.pth"))
            torch.cuda.set_rng_state(torch.load(args.ckpt + "/rng.pt")[0])
            model.load_state_dict(torch.load(os.path.join(args.ckpt, "weights.pt")))
            model.load_state_dict(torch.load(os.path.join(args.ckpt, "last.pt")))
            model.load_state_dict(torch.load(os.path.join(args.ckpt, "downloaded.pt")))
        """,
    )
    assert codes(lint(tmp_path, ("DPL506",))) == [("sample.py", 12, "DPL506"), ("sample.py", 13, "DPL506")]  # last.pt and downloaded.pt


def test_a_file_named_by_a_constant_another_module_imports_is_followed_to_its_writer(tmp_path):
    write(
        tmp_path,
        "ckpt.py",
        """
        from pathlib import Path
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        CONSOLIDATED = "consolidated.pth"

        def consolidate(dcp_dir, out_dir):
            dcp_to_torch_save(dcp_dir, str(Path(out_dir) / CONSOLIDATED))  # builds every tensor on the CPU
        """,
    )
    write(
        tmp_path,
        "generate.py",
        """
        import os
        import torch
        import torch.distributed as dist
        from ckpt import CONSOLIDATED

        def load(model, path):
            dist.init_process_group("nccl")
            model.cuda()
            with open(os.path.join(path, CONSOLIDATED), "rb") as f:
                model.load_state_dict(torch.load(f))
            with open(os.path.join(path, "other.pth"), "rb") as f:  # the same name, another file
                model.load_state_dict(torch.load(f))
        """,
    )
    assert codes(lint(tmp_path, ("DPL506",))) == [("generate.py", 13, "DPL506")]
