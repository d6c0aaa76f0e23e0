"""The same script with runtime pitfalls: no set_epoch, a forward through `.module`, a save on every rank."""

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
    dist.init_process_group(backend="nccl")
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")

    torch.manual_seed(0)
    model = DDP(Classifier().to(device), device_ids=[local_rank])
    loader, sampler = train_loader(args.batch_size, distributed=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(args.epochs):
        for inputs, targets in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model.module(inputs), targets)
            loss.backward()
            optimizer.step()
    torch.save(model.module.state_dict(), args.checkpoint)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
