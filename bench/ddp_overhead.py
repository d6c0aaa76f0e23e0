"""`dplint run` against torchrun on the same DDP training script: a small model, 200 steps, 2 gloo ranks on CPU.

    python bench/ddp_overhead.py [--steps 200] [--repeats 5] [--ranks 2]

Each repeat runs the two commands back to back, in turn:

    python -m dplint run --nproc-per-node 2 bench/ddp_overhead.py --train            (every check on)
    python -m torch.distributed.run --standalone --nproc-per-node 2 bench/ddp_overhead.py --train

and times each whole command (start-up, rendezvous and teardown included). The figures are the median
wall time of each and the median of the per-pair ratios; the training loop's own median step time,
as rank 0 measured it, is shown beside them. With `--train` this file is the training script itself.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from typing import List, Tuple

WARMUP = 20
HERE = os.path.abspath(__file__)


def train(steps: int) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    dist.init_process_group("gloo")
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
    if dist.get_rank() == 0:
        print(f"step-ms {statistics.median(times[WARMUP:]) * 1e3:.3f} threads {torch.get_num_threads()}")
    dist.destroy_process_group()


def timed(command: List[str]) -> Tuple[float, float]:
    """Wall seconds of the whole command, and the median step time (ms) rank 0 printed."""
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - started
    found = re.search(r"step-ms ([\d.]+)", result.stdout)
    if result.returncode != 0 or found is None:
        sys.exit(f"{' '.join(command)} failed (exit {result.returncode}):\n{result.stdout}{result.stderr}")
    return wall, float(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--train", action="store_true", help="be the training script (what the launchers run)")
    args = parser.parse_args()
    if args.train:
        train(args.steps)
        return
    script = [HERE, "--train", "--steps", str(args.steps)]
    commands = {
        "dplint run": [sys.executable, "-m", "dplint", "run", "--nproc-per-node", str(args.ranks), *script],
        "torchrun": [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.ranks), *script],
    }
    runs = {name: [] for name in commands}
    for _ in range(args.repeats):
        for name, command in commands.items():
            runs[name].append(timed(command))
    ratios = [mine[0] / theirs[0] for mine, theirs in zip(runs["dplint run"], runs["torchrun"])]
    print(f"{args.ranks} ranks, {args.steps} steps, {args.repeats} pairs, every check on")
    print(f"{'launcher':<12}{'wall s (median)':>17}{'ms/step (median)':>18}")
    for name, measured in runs.items():
        print(f"{name:<12}{statistics.median(w for w, _ in measured):>17.2f}{statistics.median(s for _, s in measured):>18.3f}")
    print(f"dplint run / torchrun, wall time: median {statistics.median(ratios):.2f}x (pairs {min(ratios):.2f}x-{max(ratios):.2f}x)")


if __name__ == "__main__":
    main()
