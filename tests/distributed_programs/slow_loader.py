"""A torchrun script stuck in a slow data pipeline: each rank and its DataLoader workers write their pids, then wait.

With a second argument `gpu0`, every rank first puts a tensor on GPU 0 (DPL508), a finding made before the wait.
"""

import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

PIDS = Path(sys.argv[1])


class Slow(Dataset):
    def __len__(self) -> int:
        return 1000

    def __getitem__(self, index: int) -> int:
        time.sleep(60)
        return index


def record(name: str) -> None:
    """Write this process's pid under `name` in one step: the test reads each file as soon as it appears."""
    partial = PIDS / f"partial{os.getpid()}"
    partial.write_text(str(os.getpid()))
    partial.replace(PIDS / name)


def record_worker(worker_id: int) -> None:
    record(f"worker-{os.environ['RANK']}-{worker_id}")


if __name__ == "__main__":
    dist.init_process_group("gloo")
    if sys.argv[2:] == ["gpu0"]:
        torch.zeros(1).cuda(0)
    record(f"rank-{dist.get_rank()}")
    for batch in DataLoader(Slow(), batch_size=4, num_workers=2, worker_init_fn=record_worker):
        pass
