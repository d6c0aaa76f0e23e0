"""Benchmark: the runtime hook's overhead on a DataParallel forward, without simulation, on CPU.

    python bench/runtime_overhead.py [--steps 300] [--rounds 7]

A 4-layer MLP of width 1024 on a batch of 64: the same wrapped model is timed with the hook off and
on, in alternating rounds (so drift in the machine's speed affects both), and the medians compared.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from dplint import runtime


def mlp(width: int = 1024, layers: int = 4) -> nn.Module:
    blocks = []
    for _ in range(layers):
        blocks += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*blocks)


def timed(model: nn.Module, batch: torch.Tensor, steps: int) -> float:
    start = time.perf_counter()
    with torch.no_grad():
        for _ in range(steps):
            model(batch)
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.DataParallel(mlp())
    batch = torch.randn(64, 1024)
    timed(model, batch, 20)  # warm up
    plain, hooked = [], []
    for _ in range(args.rounds):
        plain.append(timed(model, batch, args.steps))
        with runtime.checking():
            hooked.append(timed(model, batch, args.steps))
    base, checked = statistics.median(plain), statistics.median(hooked)
    print(f"forward, 4 x Linear(1024) + ReLU, batch 64, {torch.get_num_threads()} threads, {args.rounds} rounds of {args.steps}")
    print(f"unhooked: {base * 1e3:.3f} ms   hooked: {checked * 1e3:.3f} ms   overhead: {(checked / base - 1) * 100:+.2f} %")


if __name__ == "__main__":
    main()
