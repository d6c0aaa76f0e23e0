"""A torchrun script where rank 0 writes a checkpoint, then waits at a barrier the other ranks never reach."""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Linear(4, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(3):
        for _ in range(4):
            optimizer.zero_grad()
            inputs = torch.randn(8, 4)
            F.mse_loss(model(inputs), inputs[:, :2]).backward()
            optimizer.step()
        if rank == 0:
            torch.save(model.module.state_dict(), f"epoch{epoch}.pt")
            dist.barrier()  # the checkpoint is written
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
