"""Current tutorials' style: the device-generic API, with the default device set instead of `.to(device)`."""

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--no-set-device", action="store_true", help="the bug: every rank's bare 'cuda' is GPU 0")
args = parser.parse_args()

device = torch.accelerator.current_accelerator()
dist.init_process_group(backend=dist.get_default_backend_for_device(device))
rank = dist.get_rank()
if not args.no_set_device:
    torch.accelerator.set_device_index(rank)
torch.set_default_device("cuda")
assert torch.get_default_device() == torch.device("cuda", torch.accelerator.current_device_index())
model = DDP(nn.Linear(4, 2))  # parameters made on the default device
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(2):
    with torch.device("cuda"):
        batch = torch.randn(8, 4)  # on the current GPU, from the context
    loss = model(batch).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
torch.set_default_device(None)
assert torch.get_default_device() == torch.device("cpu")
dist.destroy_process_group()
