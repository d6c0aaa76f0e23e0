"""Evaluate a checkpoint on every rank of a torchrun job and report the global accuracy."""
import os

import torch
import torch.distributed as dist


@torch.no_grad()
def evaluate(model, loader, device):
    model.eval()
    correct = torch.zeros(1, device=device)
    for images, labels in loader:
        logits = model(images.to(device))
        correct += (logits.argmax(1) == labels.to(device)).sum()
    # Sum the counts of all ranks before dividing.
    correct = dist.all_reduce(correct, op=dist.ReduceOp.SUM)  # in place
    return correct.item() / len(loader.dataset)


def main():
    dist.init_process_group("nccl")
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    model = build_model().to(device)
    print(evaluate(model, build_loader(), device))
