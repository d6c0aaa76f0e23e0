"""vq-vae-2's shape: rank 0 alone samples from the DDP model (BatchNorm buffers) between training steps."""

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--every-rank", action="store_true", help="every rank samples: the fixed program")
args = parser.parse_args()

dist.init_process_group("gloo")
model = DDP(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    loss = model(torch.randn(8, 4)).sum()  # training forward
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if args.every_rank or dist.get_rank() == 0:
        model.eval()
        with torch.no_grad():
            sample = model(torch.randn(2, 4))  # evaluation forward
        model.train()
dist.destroy_process_group()
