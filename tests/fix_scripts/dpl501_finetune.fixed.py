"""Fine-tune a ResNet-50 on an ImageFolder dataset with DistributedDataParallel.

    torchrun --nproc-per-node 8 dpl501_finetune.py --data /datasets/flowers --epochs 20
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from torchvision import datasets, models, transforms


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=64, help="per GPU")
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--num-classes", type=int, default=102)
    parser.add_argument("--workers", type=int, default=8)
    return parser.parse_args()


def train_epoch(model, loader, optimizer, epoch, rank):
    model.train()
    start = time.time()
    for step, (images, labels) in enumerate(loader):
        images = images.cuda(non_blocking=True)
        labels = labels.cuda(non_blocking=True)
        loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if rank == 0 and step % 100 == 0:
            print(f"epoch {epoch} step {step} loss {loss.item():.3f} ({time.time() - start:.0f}s)")


def main():
    args = parse_args()
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)

    augment = transforms.Compose([
        transforms.RandomResizedCrop(224),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
    ])
    dataset = datasets.ImageFolder(os.path.join(args.data, "train"), augment)
    sampler = DistributedSampler(dataset, shuffle=True)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler,
                        num_workers=args.workers, pin_memory=True, drop_last=True)

    model = models.resnet50(weights="IMAGENET1K_V2")
    model.fc = nn.Linear(model.fc.in_features, args.num_classes)
    model = DistributedDataParallel(model.cuda(), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, args.epochs)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        # one pass over the training set, then the schedule
        train_epoch(model, loader, optimizer, epoch, rank)
        scheduler.step()

    if rank == 0:
        torch.save(model.module.state_dict(), "resnet50_finetuned.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
