"""A trainer in the style of pytorch/examples' multigpu_torchrun.py: it peeks at a batch for the batch size
before `set_epoch`, evaluates over the training loader and over a validation loader after each epoch."""

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def synthetic(samples: int, seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(samples, 6, generator=generator)
    return TensorDataset(inputs, (inputs[:, 0] > 0).long())


class Trainer:
    def __init__(self, model: nn.Module, train_data: DataLoader, val_data: DataLoader, set_epoch: bool) -> None:
        self.model = DDP(model)
        self.train_data = train_data
        self.val_data = val_data
        self.set_epoch = set_epoch
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05)

    def _run_batch(self, source: torch.Tensor, targets: torch.Tensor) -> None:
        self.optimizer.zero_grad()
        F.cross_entropy(self.model(source), targets).backward()
        self.optimizer.step()

    def _run_epoch(self, epoch: int) -> None:
        b_sz = len(next(iter(self.train_data))[0])
        if dist.get_rank() == 0:
            print(f"Epoch {epoch} | Batchsize: {b_sz} | Steps: {len(self.train_data)}")
        if self.set_epoch:
            self.train_data.sampler.set_epoch(epoch)
        self.model.train()
        for source, targets in self.train_data:
            self._run_batch(source, targets)

    @torch.no_grad()
    def evaluate(self, loader: DataLoader) -> float:
        self.model.eval()
        correct = torch.zeros(2)
        for source, targets in loader:
            correct += torch.tensor([(self.model(source).argmax(1) == targets).sum().item(), len(targets)])
        dist.all_reduce(correct)
        return (correct[0] / correct[1]).item()

    def train(self, max_epochs: int, eval_train: bool) -> None:
        for epoch in range(max_epochs):
            self._run_epoch(epoch)
            if eval_train:
                train_accuracy = self.evaluate(self.train_data)
            val_accuracy = self.evaluate(self.val_data)
            if dist.get_rank() == 0:
                print(f"Epoch {epoch} | val accuracy {val_accuracy:.3f}" + (f" | train accuracy {train_accuracy:.3f}" if eval_train else ""))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--eval-train", action="store_true", help="also evaluate over the training loader")
    parser.add_argument("--no-set-epoch", dest="set_epoch", action="store_false")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    train_set, val_set = synthetic(64, 0), synthetic(32, 1)
    train_data = DataLoader(train_set, batch_size=8, sampler=DistributedSampler(train_set))
    val_data = DataLoader(val_set, batch_size=8, sampler=DistributedSampler(val_set))  # shuffles too: it does not train
    Trainer(nn.Linear(6, 2), train_data, val_data, args.set_epoch).train(args.epochs, args.eval_train)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
