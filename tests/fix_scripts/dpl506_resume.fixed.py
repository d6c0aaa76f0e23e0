"""Train a segmentation model with DDP under torchrun, resuming from the last checkpoint if there is one."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from data import build_loader
from models import UNet

CHECKPOINT = "checkpoints/last.pt"


def setup():
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    return local_rank


def main():
    local_rank = setup()
    device = torch.device(f"cuda:{local_rank}")
    model = UNet(in_channels=3, classes=2).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    start_epoch = 0
    if os.path.exists(CHECKPOINT):
        checkpoint = torch.load(CHECKPOINT, map_location=device)
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        start_epoch = checkpoint["epoch"] + 1
    model = DDP(model, device_ids=[local_rank])

    loader = build_loader(batch_size=8)
    criterion = nn.CrossEntropyLoss()
    for epoch in range(start_epoch, 100):
        loader.sampler.set_epoch(epoch)
        for images, masks in loader:
            images, masks = images.to(device), masks.to(device)
            loss = criterion(model(images), masks)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if dist.get_rank() == 0:
            state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}
            torch.save(state, CHECKPOINT)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
