"""A torchrun script whose DataLoader loads in worker processes, as most image pipelines do."""

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class Noise(Dataset):
    """Images made on the fly: each sample is decoded (here: generated) in a worker."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int):
        generator = torch.Generator().manual_seed(index)
        image = torch.randn(3, 8, 8, generator=generator)
        return image, int(image.mean() > 0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    # One write per line: two ranks share the pipe, and print() writes the text and its newline apart.
    print(f"rank {dist.get_rank()} threads {torch.get_num_threads()}\n", end="", flush=True)
    dataset = Noise()
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler, num_workers=args.workers, persistent_workers=args.workers > 0)
    model = DDP(nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for images, labels in loader:
            optimizer.zero_grad()
            F.cross_entropy(model(images), labels).backward()
            optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
