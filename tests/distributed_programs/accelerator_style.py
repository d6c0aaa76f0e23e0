"""torch.accelerator style, as current pytorch/examples tutorials: the device from `current_accelerator()`, the backend
from `get_default_backend_for_device`, each rank on `set_device_index(rank)`. The evaluation after training runs the
unwrapped model on `--eval-device` (default: this rank's device)."""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--eval-device", default=None)
    args = parser.parse_args()
    rank = int(os.environ["LOCAL_RANK"])
    acc = torch.accelerator.current_accelerator()
    backend = dist.get_default_backend_for_device(acc)
    torch.accelerator.set_device_index(rank)
    dist.init_process_group(backend=backend)
    device = torch.device(acc.type, torch.accelerator.current_device_index())
    print(f"rank {dist.get_rank()} of {dist.get_world_size()} on {device} ({torch.accelerator.device_count()} devices), backend {dist.get_backend()}")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 5)).to(device)
    ddp_model = DDP(model, device_ids=[rank])
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.001)
    for _ in range(3):
        optimizer.zero_grad()
        outputs = ddp_model(torch.randn(20, 10, device=device))
        nn.MSELoss()(outputs, torch.randn(20, 5, device=device)).backward()
        optimizer.step()
    torch.accelerator.synchronize()
    with torch.no_grad():
        batch = torch.randn(20, 10).to(args.eval_device or device)
        ddp_model.module.eval()
        ddp_model.module(batch)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
