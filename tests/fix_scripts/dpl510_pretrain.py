"""Pretrain a small GPT on tokenized shards, one process per GPU:

    python -m torch.distributed.launch --nproc_per_node=4 dpl510_pretrain.py --data data/shards
"""
import argparse
import math

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from model import GPT, GPTConfig


def get_args():
    parser = argparse.ArgumentParser(description="GPT pretraining")
    parser.add_argument("--data", type=str, default="data/shards")
    parser.add_argument("--block-size", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=12)
    parser.add_argument("--max-iters", type=int, default=600000)
    parser.add_argument("--lr", type=float, default=6e-4)
    parser.add_argument("--local_rank", type=int, default=-1,
                        help="set by the launcher")  # one process per GPU
    return parser.parse_args()


def learning_rate(step, args, warmup=2000):
    if step < warmup:
        return args.lr * step / warmup
    progress = (step - warmup) / max(1, args.max_iters - warmup)
    return 0.1 * args.lr + 0.45 * args.lr * (1 + math.cos(math.pi * progress))


def get_batch(data, args, device):
    starts = torch.randint(len(data) - args.block_size, (args.batch_size,))
    x = torch.stack([torch.from_numpy(data[i:i + args.block_size].astype(np.int64)) for i in starts])
    y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + args.block_size].astype(np.int64)) for i in starts])
    return x.to(device, non_blocking=True), y.to(device, non_blocking=True)


def main():
    args = get_args()
    torch.cuda.set_device(args.local_rank)
    dist.init_process_group(backend="nccl", init_method="env://")
    device = torch.device("cuda", args.local_rank)
    data = np.memmap(f"{args.data}/train.bin", dtype=np.uint16, mode="r")

    model = GPT(GPTConfig(block_size=args.block_size)).to(device)
    model = DDP(model, device_ids=[args.local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    for step in range(args.max_iters):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, args)
        x, y = get_batch(data, args, device)
        _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
