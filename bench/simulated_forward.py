"""Benchmark: what a simulated DataParallel forward costs, on a ResNet-18 built from torch.nn, on CPU.

    python bench/simulated_forward.py [--devices 2] [--batch 16] [--size 64] [--steps 5] [--rounds 5]

Times, in alternating rounds (so drift in the machine's speed affects all alike), medians of:
- the plain module on the whole batch;
- the module on each chunk, concatenated (what N GPUs compute, run one after the other here);
- `nn.DataParallel` under `dplint.runtime.checking(devices=N)`;
- the same with the row-independence check (`check_rows=True`, DPL309), where this dplint has it.
Also counts how often per forward DPL103's device-check cache is invalidated (it should be never).
The forward runs with gradients on, in training mode, as in a training step.
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import time
from typing import Callable, Dict, List

import torch
from torch import nn

from dplint import runtime
from dplint.runtime.dataparallel import checks as dataparallel


class BasicBlock(nn.Module):
    def __init__(self, inputs: int, outputs: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inputs, outputs, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(outputs)
        self.conv2 = nn.Conv2d(outputs, outputs, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(outputs)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or inputs != outputs:
            self.downsample = nn.Sequential(nn.Conv2d(inputs, outputs, 1, stride, bias=False), nn.BatchNorm2d(outputs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + identity)


def resnet18(classes: int = 1000) -> nn.Module:
    """torchvision's resnet18 layout (62 parameters, 60 buffers), which cannot be installed here."""
    layers: List[nn.Module] = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
    width = 64
    for outputs, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [BasicBlock(width, outputs, stride), BasicBlock(outputs, outputs, 1)]
        width = outputs
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, classes)]
    return nn.Sequential(*layers)


def timed(step: Callable[[], object], steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = resnet18()
    wrapper = nn.DataParallel(model)
    batch = torch.randn(args.batch, 3, args.size, args.size)
    has_row_check = "check_rows" in inspect.signature(runtime.checking).parameters

    def chunked() -> torch.Tensor:
        return torch.cat([model(chunk) for chunk in batch.chunk(args.devices)])

    def simulated(**options: object) -> Callable[[], object]:
        def step() -> object:
            with runtime.checking(devices=args.devices, action="warn", **options):
                return wrapper(batch)

        return step

    variants: Dict[str, Callable[[], object]] = {
        "plain module, whole batch": lambda: model(batch),
        f"module on {args.devices} chunks, concatenated": chunked,
        "simulated DataParallel": simulated(),
    }
    if has_row_check:
        variants["simulated, check_rows=True"] = simulated(check_rows=True)
    for step in variants.values():
        step()  # warm up
    times: Dict[str, List[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, step in variants.items():
            times[name].append(timed(step, args.steps))

    with runtime.checking(devices=args.devices, action="warn"):
        wrapper(batch)
        before = dataparallel._generation[0]
        for _ in range(args.steps):
            wrapper(batch)
        invalidations = (dataparallel._generation[0] - before) / args.steps

    print(
        f"resnet18 (torch.nn), batch {args.batch}x3x{args.size}x{args.size}, {args.devices} simulated devices, "
        f"{torch.get_num_threads()} threads, {args.rounds} rounds of {args.steps}, training mode with gradients"
    )
    base = statistics.median(times[f"module on {args.devices} chunks, concatenated"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:<40} {median * 1e3:9.1f} ms   {(median / base - 1) * 100:+7.1f} % vs chunks")
    print(f"  DPL103 cache invalidations per simulated forward: {invalidations:g}")


if __name__ == "__main__":
    main()
