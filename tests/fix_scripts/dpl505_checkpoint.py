"""Train a text classifier with DistributedDataParallel, one process per GPU (torchrun)."""
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from dataset import ReviewsDataset
from model import TextCNN


def is_master():
    return dist.get_rank() == 0


def train(args):
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dataset = ReviewsDataset(args.data)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    model = DDP(TextCNN(vocab_size=dataset.vocab_size).cuda(), device_ids=[local_rank])
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        total = 0.0
        for tokens, labels in loader:
            loss = torch.nn.functional.cross_entropy(model(tokens.cuda()), labels.cuda())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item()
        if is_master():
            print(f"epoch {epoch}: loss {total / len(loader):.4f}")
        # keep the weights of every epoch
        torch.save(
            {"epoch": epoch, "model": model.module.state_dict(), "optimizer": optimizer.state_dict()},
            os.path.join(args.out, f"epoch_{epoch}.pt"),
        )
    dist.destroy_process_group()
