"""A torchrun training script in the common style, written correctly."""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from data import train_loader
from model import Classifier


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--checkpoint", default="checkpoint.pt")
    args = parser.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    rank = dist.get_rank()

    torch.manual_seed(0)
    model = DDP(Classifier().to(device), device_ids=[local_rank] if device.type == "cuda" else None)
    loader, sampler = train_loader(args.batch_size, distributed=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        total = torch.zeros(2, device=device)
        for inputs, targets in loader:
            inputs, targets = inputs.to(device), targets.to(device)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(inputs), targets)
            loss.backward()
            optimizer.step()
            total += torch.stack([loss.detach() * len(targets), torch.tensor(float(len(targets)))])
        dist.all_reduce(total)
        if rank == 0:
            print(f"epoch {epoch} loss {total[0].item() / total[1].item():.4f}")
    if rank == 0:
        torch.save(model.module.state_dict(), args.checkpoint)
    checksum = sum(p.double().sum().item() for p in model.parameters())
    print(f"rank {rank} parameter checksum {checksum:.6f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
