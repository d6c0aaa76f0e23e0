"""torchrun tutorial style: LOCAL_RANK from the environment, `model.to(local_rank)`, `DDP(device_ids=[local_rank])`.

`--legacy-local-rank` reads the rank from an argparse `--local_rank` option instead, as scripts written for
torch.distributed.launch do: torchrun never passes it, so every rank keeps its default, 0.
"""

import argparse
import os

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class Squares(Dataset):
    def __init__(self, size: int) -> None:
        self.inputs = torch.rand(size, 20)

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index: int):
        x = self.inputs[index]
        return x, x.pow(2).sum(dim=0, keepdim=True)


class Trainer:
    def __init__(self, model: nn.Module, loader: DataLoader, gpu_id: int) -> None:
        self.gpu_id = gpu_id
        self.model = model.to(gpu_id)
        self.loader = loader
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=1e-3)
        self.model = DDP(self.model, device_ids=[gpu_id])

    def train(self, epochs: int) -> None:
        for epoch in range(epochs):
            self.loader.sampler.set_epoch(epoch)
            for source, targets in self.loader:
                source = source.to(self.gpu_id)
                targets = targets.to(self.gpu_id)
                self.optimizer.zero_grad()
                F.mse_loss(self.model(source), targets).backward()
                self.optimizer.step()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--legacy-local-rank", action="store_true")
    parser.add_argument("--local_rank", type=int, default=0)
    args = parser.parse_args()
    local_rank = args.local_rank if args.legacy_local_rank else int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    init_process_group(backend="nccl")
    torch.manual_seed(0)
    dataset = Squares(128)
    loader = DataLoader(dataset, batch_size=16, shuffle=False, sampler=DistributedSampler(dataset), num_workers=2, pin_memory=True)
    Trainer(nn.Linear(20, 1), loader, local_rank).train(args.epochs)
    destroy_process_group()


if __name__ == "__main__":
    main()
