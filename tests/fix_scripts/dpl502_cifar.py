"""CIFAR-10 classifier: one process per GPU under torchrun, or a single process without it."""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from torchvision import datasets, models, transforms


def get_args():
    parser = argparse.ArgumentParser(description="CIFAR-10 training")
    parser.add_argument("--data", default="./data")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--workers", type=int, default=4)
    return parser.parse_args()


def train_one_epoch(model, loader, optimizer, criterion, device):
    model.train()
    for images, targets in loader:
        images, targets = images.to(device, non_blocking=True), targets.to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        loss = criterion(model(images), targets)
        loss.backward()
        optimizer.step()


def main():
    args = get_args()
    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group(backend="nccl")
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    transform = transforms.Compose([transforms.RandomCrop(32, padding=4), transforms.ToTensor()])
    train_set = datasets.CIFAR10(args.data, train=True, download=True, transform=transform)
    train_sampler = DistributedSampler(train_set) if distributed else None
    train_loader = DataLoader(
        train_set,
        batch_size=args.batch_size,
        shuffle=True,
        sampler=train_sampler,
        num_workers=args.workers,
        pin_memory=True,
    )

    model = models.resnet18(num_classes=10).to(device)
    if distributed:
        model = DDP(model, device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    criterion = nn.CrossEntropyLoss()

    for epoch in range(args.epochs):
        if distributed:
            train_sampler.set_epoch(epoch)
        train_one_epoch(model, train_loader, optimizer, criterion, device)

    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
