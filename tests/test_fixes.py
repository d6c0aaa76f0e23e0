"""The fixes of the distributed rules: where each is offered and where not (the rules' INVALID examples
show the fixed output of each), and each applied through the CLI to a realistic training script."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import List

import pytest

from dplint import lint_source
from dplint.fixes import apply_fixes


def fixes(source: str, code: str) -> List[object]:
    """The fix of each finding of `code` in `source` (None where there is none)."""
    return [f.fix for f in lint_source(textwrap.dedent(source).lstrip("\n"), "train.py", select=[code])]


# ----- fixed code: the cases the rules' examples leave out -------------------------------------------

FIXED = {
    "DPL502: a comment line after the argument dropped stays, before the next argument": (
        "DPL502",
        """
        from torch.utils.data import DataLoader, DistributedSampler

        def build(dataset):
            return DataLoader(
                dataset,  # the training split
                shuffle=True,  # every epoch
                # one shard per rank:
                sampler=DistributedSampler(dataset),
            )
        """,
        """
        from torch.utils.data import DataLoader, DistributedSampler

        def build(dataset):
            return DataLoader(
                dataset,  # the training split
                # one shard per rank:
                sampler=DistributedSampler(dataset),
            )
        """,
    ),
    "DPL502: the first argument dropped, and the last with `)` on its own line": (
        "DPL502",
        """
        from torch.utils.data import DataLoader, DistributedSampler
        first = DataLoader(shuffle=True, dataset=train_set, sampler=DistributedSampler(train_set))
        last = DataLoader(train_set,
                          sampler=DistributedSampler(train_set),  # sharded
                          shuffle=True
                          )
        """,
        """
        from torch.utils.data import DataLoader, DistributedSampler
        first = DataLoader(dataset=train_set, sampler=DistributedSampler(train_set))
        last = DataLoader(train_set,
                          sampler=DistributedSampler(train_set)  # sharded
                          )
        """,
    ),
    "DPL501: a sampler built in the DataLoader call is stepped through the loader, in a file indented by tabs": (
        "DPL501",
        """
        from torch.utils.data import DataLoader, DistributedSampler

        def train(model, train_set, epochs):
        \ttrain_loader = DataLoader(train_set, batch_size=64, sampler=DistributedSampler(train_set))
        \tfor epoch in range(epochs):

        \t\tfor x, y in train_loader:
        \t\t\tmodel(x).sum().backward()
        """,
        """
        from torch.utils.data import DataLoader, DistributedSampler

        def train(model, train_set, epochs):
        \ttrain_loader = DataLoader(train_set, batch_size=64, sampler=DistributedSampler(train_set))
        \tfor epoch in range(epochs):
        \t\ttrain_loader.sampler.set_epoch(epoch)

        \t\tfor x, y in train_loader:
        \t\t\tmodel(x).sum().backward()
        """,
    ),
    "DPL510: a default of None with type=int, and os imported under another name": (
        "DPL510",
        """
        import os as _os
        import argparse
        import torch.distributed as dist
        parser = argparse.ArgumentParser()
        parser.add_argument("--local_rank", default=None, type=int)
        args = parser.parse_args()
        dist.init_process_group("nccl")
        torch.cuda.set_device(args.local_rank)
        """,
        """
        import os as _os
        import argparse
        import torch.distributed as dist
        parser = argparse.ArgumentParser()
        parser.add_argument("--local_rank", default=_os.environ.get("LOCAL_RANK"), type=int)
        args = parser.parse_args()
        dist.init_process_group("nccl")
        torch.cuda.set_device(args.local_rank)
        """,
    ),
    "DPL510: `import os` in alphabetical place in the first group after `from __future__` imports": (
        "DPL510",
        """
        from __future__ import annotations

        from argparse import ArgumentParser
        import torch.distributed as dist
        parser = ArgumentParser()
        parser.add_argument("--local_rank", type=int, default=0)
        dist.init_process_group("nccl")
        torch.cuda.set_device(parser.parse_args().local_rank)
        """,
        """
        from __future__ import annotations

        from argparse import ArgumentParser
        import os
        import torch.distributed as dist
        parser = ArgumentParser()
        parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group("nccl")
        torch.cuda.set_device(parser.parse_args().local_rank)
        """,
    ),
    "DPL506: f\"cuda:{local_rank}\" from the function's local rank": (
        "DPL506",
        """
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        def main_worker(local_rank, args):
            dist.init_process_group("nccl", rank=local_rank, world_size=args.world_size)
            model = DDP(build_model().cuda(local_rank), device_ids=[local_rank])
            model.module.load_state_dict(torch.load(args.weights))
        """,
        """
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        def main_worker(local_rank, args):
            dist.init_process_group("nccl", rank=local_rank, world_size=args.world_size)
            model = DDP(build_model().cuda(local_rank), device_ids=[local_rank])
            model.module.load_state_dict(torch.load(args.weights, map_location=f"cuda:{local_rank}"))
        """,
    ),
    "DPL506: the trainer's device, set in __init__ from the rank it was given": (
        "DPL506",
        """
        import torch
        import torch.distributed as dist
        import torch.multiprocessing as mp
        from torch.nn.parallel import DistributedDataParallel as DDP

        class Trainer:
            def __init__(self, model, gpu_id):
                self.device = torch.device(f"cuda:{gpu_id}")
                self.model = DDP(model.to(self.device), device_ids=[gpu_id])

            def resume(self, path):
                snapshot = torch.load(path)
                self.model.module.load_state_dict(snapshot["model"])

        def main(rank, world_size):
            dist.init_process_group("nccl", rank=rank, world_size=world_size)
            Trainer(build_model(), rank).resume("snapshot.pt")

        mp.spawn(main, args=(4,), nprocs=4)
        """,
        """
        import torch
        import torch.distributed as dist
        import torch.multiprocessing as mp
        from torch.nn.parallel import DistributedDataParallel as DDP

        class Trainer:
            def __init__(self, model, gpu_id):
                self.device = torch.device(f"cuda:{gpu_id}")
                self.model = DDP(model.to(self.device), device_ids=[gpu_id])

            def resume(self, path):
                snapshot = torch.load(path, map_location=self.device)
                self.model.module.load_state_dict(snapshot["model"])

        def main(rank, world_size):
            dist.init_process_group("nccl", rank=rank, world_size=world_size)
            Trainer(build_model(), rank).resume("snapshot.pt")

        mp.spawn(main, args=(4,), nprocs=4)
        """,
    ),
    "DPL506: a device of \"cuda\" alone is GPU 0 on every rank: the CPU instead": (
        "DPL506",
        """
        import torch
        import torch.distributed as dist

        def main(path):
            dist.init_process_group("nccl")
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            model = build_model().to(device)
            model.load_state_dict(torch.load(path))
        """,
        """
        import torch
        import torch.distributed as dist

        def main(path):
            dist.init_process_group("nccl")
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            model = build_model().to(device)
            model.load_state_dict(torch.load(path, map_location="cpu"))
        """,
    ),
    "DPL505: the class's own rank test, a save spanning lines (a string among them) in nested blocks": (
        "DPL505",
        '''
        import os
        import torch
        import torch.distributed as dist

        class Trainer:
            def __init__(self, model):
                self.gpu_id = int(os.environ["LOCAL_RANK"])
                self.model = model

            def log(self, text):
                if self.gpu_id == 0:
                    print(text)

            def train(self, epochs):
                dist.init_process_group("nccl")
                for epoch in range(epochs):
                    self.model(x).sum().backward()
                    with open("notes.txt") as notes:
                        try:
                            torch.save(
                                {"model": self.model.state_dict(),  # the weights
                                 "notes": """trained on
        the full set""" + notes.read()},
                                "snapshot.pt",
                            )
                        except OSError:
                            pass

        Trainer(build_model()).train(10)
        ''',
        '''
        import os
        import torch
        import torch.distributed as dist

        class Trainer:
            def __init__(self, model):
                self.gpu_id = int(os.environ["LOCAL_RANK"])
                self.model = model

            def log(self, text):
                if self.gpu_id == 0:
                    print(text)

            def train(self, epochs):
                dist.init_process_group("nccl")
                for epoch in range(epochs):
                    self.model(x).sum().backward()
                    with open("notes.txt") as notes:
                        try:
                            if self.gpu_id == 0:
                                torch.save(
                                    {"model": self.model.state_dict(),  # the weights
                                     "notes": """trained on
        the full set""" + notes.read()},
                                    "snapshot.pt",
                                )
                        except OSError:
                            pass

        Trainer(build_model()).train(10)
        ''',
    ),
    "DPL505: a rank test whose names the save's place lacks is not used": (
        "DPL505",
        """
        import torch
        import torch.distributed as dist

        def log(rank, text):
            if rank == 0:
                print(text)

        def train(model, epochs):
            dist.init_process_group("nccl")
            for epoch in range(epochs):
                model(x).sum().backward()
                torch.save(model.state_dict(), "last.pt")
        """,
        """
        import torch
        import torch.distributed as dist

        def log(rank, text):
            if rank == 0:
                print(text)

        def train(model, epochs):
            dist.init_process_group("nccl")
            for epoch in range(epochs):
                model(x).sum().backward()
                if dist.get_rank() == 0:
                    torch.save(model.state_dict(), "last.pt")
        """,
    ),
    "DPL505: two saves in one file share the import their fixes add (ERNIE)": (
        "DPL505",
        """
        import torch

        def main(model, args):
            torch.distributed.init_process_group("nccl")
            for epoch in range(3):
                torch.save(model.state_dict(), "epoch.bin")
            torch.save(model.state_dict(), "final.bin")
        """,
        """
        import torch
        import torch.distributed as dist

        def main(model, args):
            torch.distributed.init_process_group("nccl")
            for epoch in range(3):
                if dist.get_rank() == 0:
                    torch.save(model.state_dict(), "epoch.bin")
            if dist.get_rank() == 0:
                torch.save(model.state_dict(), "final.bin")
        """,
    ),
}


@pytest.mark.parametrize("code, source, expected", FIXED.values(), ids=list(FIXED))
def test_fixed_code(code, source, expected):
    source, expected = (textwrap.dedent(text).lstrip("\n") for text in (source, expected))
    found = lint_source(source, "train.py", select=[code])
    assert found and all(f.fix is not None for f in found)
    assert apply_fixes(source, found, unsafe=True) == (expected, found)
    compile(expected, "train.py", "exec")
    assert lint_source(expected, "train.py", select=[code]) == []


# ----- where no fix is offered ---------------------------------------------------------------------

NO_FIX = {
    "DPL512: the name assigned is not the tensor reduced": (
        "DPL512",
        """
        import torch.distributed as dist
        total = dist.all_reduce(partial)
        """,
    ),
    "DPL512: the reduced tensor is a copy made in the call": (
        "DPL512",
        """
        import torch.distributed as dist
        value = dist.all_reduce(value.detach().clone())
        """,
    ),
    "DPL512: gather writes into its second argument": (
        "DPL512",
        """
        import torch.distributed as dist
        t = dist.gather(t, gather_list, dst=0)
        """,
    ),
    "DPL512: the result is used in an expression": (
        "DPL512",
        """
        import torch.distributed as dist
        def mean(t):
            return dist.all_reduce(t) / dist.get_world_size()
        """,
    ),
    "DPL502: shuffle passed by position": (
        "DPL502",
        """
        from torch.utils.data import DataLoader, DistributedSampler
        loader = DataLoader(train_set, 32, True, DistributedSampler(train_set))
        val_loader = DataLoader(val_set, shuffle=True)  # the text prefilter looks for `shuffle=True`
        """,
    ),
    "DPL502: a sampler written in the call that may be None": (
        "DPL502",
        """
        from torch.utils.data import DataLoader, DistributedSampler
        loader = DataLoader(train_set, shuffle=True, sampler=DistributedSampler(train_set) if ddp else None)
        """,
    ),
    "DPL501: the sampler is unbound when the loop starts without --distributed": (
        "DPL501",
        """
        from torch.utils.data import DistributedSampler
        def main(args, dataset):
            if args.distributed:
                sampler = DistributedSampler(dataset)
            for epoch in range(args.epochs):
                train(dataset, sampler)
        """,
    ),
    "DPL501: the name may hold another sampler": (
        "DPL501",
        """
        from torch.utils.data import DistributedSampler, RandomSampler
        def main(args, dataset):
            sampler = DistributedSampler(dataset) if args.distributed else RandomSampler(dataset)
            for epoch in range(args.epochs):
                train(dataset, sampler)
        """,
    ),
    "DPL501: the epoch loop has no variable": (
        "DPL501",
        """
        from torch.utils.data import DistributedSampler
        sampler = DistributedSampler(dataset)
        for _ in range(num_epochs):
            train(dataset, sampler)
        """,
    ),
    "DPL501: the epoch loop is in another function": (
        "DPL501",
        """
        from torch.utils.data import DataLoader, DistributedSampler
        def build(dataset):
            sampler = DistributedSampler(dataset)
            return DataLoader(dataset, sampler=sampler)
        def main(dataset, epochs):
            loader = build(dataset)
            for epoch in range(epochs):
                train(loader)
        """,
    ),
    "DPL510: a default that is not an integer literal": (
        "DPL510",
        """
        import argparse
        import torch.distributed as dist
        parser = argparse.ArgumentParser()
        parser.add_argument("--local_rank", type=int, default=DEFAULT_RANK)
        dist.init_process_group("nccl")
        torch.cuda.set_device(parser.parse_args().local_rank)
        """,
    ),
    "DPL510: no default, and no type=int to convert the environment's string": (
        "DPL510",
        """
        import argparse
        import torch.distributed as dist
        parser = argparse.ArgumentParser()
        parser.add_argument("--local_rank")
        dist.init_process_group("nccl")
        torch.cuda.set_device(int(parser.parse_args().local_rank))
        """,
    ),
    "DPL505: the save is not a statement of its own line": (
        "DPL505",
        """
        import torch
        import torch.distributed as dist
        dist.init_process_group("nccl")
        for epoch in range(3):
            model(x).sum().backward()
            torch.save(model.state_dict(), "ckpt.pt"); print("saved")
        """,
    ),
    "DPL505: `dist` names something else and torch.distributed has no name": (
        "DPL505",
        """
        import torch
        from scipy.spatial import distance as dist
        torch.distributed.init_process_group("nccl")
        for epoch in range(3):
            model(x).sum().backward()
            torch.save(model.state_dict(), "ckpt.pt")
        """,
    ),
    "DPL312: an element of a list of wrappers, which the fix would read twice": (
        "DPL312",
        """
        import torch
        import torch.nn as nn
        heads = [nn.DataParallel(head) for head in build_heads()]
        torch.save(heads[0].state_dict(), "head0.pt")
        """,
    ),
}


@pytest.mark.parametrize("code, source", NO_FIX.values(), ids=list(NO_FIX))
def test_no_fix_where_the_intent_is_not_clear(code, source):
    assert fixes(source, code) == [None]


# ----- each fix on a realistic script, through the CLI ----------------------------------------------

# Training scripts in the style of public code, each with one finding that a fix addresses
# (`dpl512_evaluate.py`: DPL512), beside what `--fix --unsafe-fixes` must make of it (`.fixed.py`).
SCRIPTS = sorted(p for p in (Path(__file__).parent / "fix_scripts").glob("*.py") if not p.name.endswith(".fixed.py"))


def dplint(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dplint", "--no-cache", *args], cwd=cwd, capture_output=True, text=True)


def findings(folder: Path) -> List[dict]:
    """What every rule, preview ones included, finds in the folder, as JSON."""
    return json.loads(dplint("--preview", "--select", "ALL", "--format", "json", ".", cwd=folder).stdout)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_fix_of_a_realistic_script(script, tmp_path):
    """Through the CLI, what every fix promises: the expected result, which compiles, without the finding
    and without any new one; an unsafe fix only with `--unsafe-fixes` (`--diff` shows it); a second
    `--fix` changes nothing."""
    code = script.name.split("_")[0].upper()
    copy = tmp_path / "train.py"
    copy.write_text(script.read_text())
    before = findings(tmp_path)
    (finding,) = [f for f in before if f["code"] == code]
    fix = "--fix", "--preview", "--select", "ALL"
    if finding["fix"]["applicability"] == "unsafe":
        dplint(*fix, "train.py", cwd=tmp_path)
        assert copy.read_text() == script.read_text()
        diff = dplint("--diff", "--unsafe-fixes", "--preview", "--select", code, "train.py", cwd=tmp_path)
        assert diff.returncode == 1 and diff.stdout.startswith("--- a/train.py")
        fix += ("--unsafe-fixes",)
    assert "Fixed 1 finding" in dplint(*fix, "train.py", cwd=tmp_path).stderr
    fixed = copy.read_text()
    assert fixed == script.with_name(script.stem + ".fixed.py").read_text()
    compile(fixed, "train.py", "exec")
    after = Counter(f["code"] for f in findings(tmp_path))
    assert not after - (Counter(f["code"] for f in before) - Counter([code]))
    dplint(*fix, "train.py", cwd=tmp_path)
    assert copy.read_text() == fixed
