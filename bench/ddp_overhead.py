"""What dplint's distributed checks cost per training step: a small DDP model, 200 steps, 2 gloo ranks on CPU.

    python bench/ddp_overhead.py [--steps 200] [--repeats 3] [--ranks 2]

Each configuration (no checks, each check alone, every check) runs `--repeats` times, interleaved so
that load on the machine hits all of them alike. A run's figure is the median step time of rank 0
after 20 warm-up steps; a configuration's figure is the lowest over its runs. "none" still has the
CPU shims (NCCL as gloo, DDP device_ids), which cost nothing per step.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Dict, List, Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from dplint.distributed import ALL_CHECKS, launch

WARMUP = 20


def train(steps: int) -> List[float]:
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10)))
    inputs = torch.randn(4096, 64)
    data = TensorDataset(inputs, inputs.argmax(dim=1) % 10)
    sampler = DistributedSampler(data, seed=0)
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    times: List[float] = []
    epoch = 0
    while len(times) < steps + WARMUP:
        sampler.set_epoch(epoch)
        epoch += 1
        batches = iter(loader)
        while len(times) < steps + WARMUP:
            started = time.perf_counter()
            try:
                x, y = next(batches)
            except StopIteration:
                break
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            times.append(time.perf_counter() - started)
    total = torch.tensor([1.0])
    dist.all_reduce(total)  # one user collective, as a training loop's metric reduction would be
    return times[WARMUP:]


def measure(checks: Optional[Sequence[str]], steps: int, ranks: int) -> float:
    results = launch(train, steps, nprocs=ranks, timeout=60, checks=checks)
    return statistics.median(results[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=2)
    args = parser.parse_args()
    configurations: Dict[str, Optional[Sequence[str]]] = {"none": [], **{name: [name] for name in ALL_CHECKS}, "all": None}
    runs: Dict[str, List[float]] = {name: [] for name in configurations}
    launch(train, 5, nprocs=args.ranks, timeout=60, checks=[])  # warm the ranks' forkserver
    for _ in range(args.repeats):
        for name, checks in configurations.items():
            runs[name].append(measure(checks, args.steps, args.ranks))
    baseline = min(runs["none"])
    print(f"{args.ranks} ranks, {args.steps} steps, median step time (best of {args.repeats} runs), torch {torch.__version__}")
    print(f"{'checks':<20}{'ms/step':>10}{'overhead':>10}")
    for name in configurations:
        best = min(runs[name])
        print(f"{name:<20}{best * 1e3:>10.3f}{(best / baseline - 1) * 100:>9.1f}%")


if __name__ == "__main__":
    main()
