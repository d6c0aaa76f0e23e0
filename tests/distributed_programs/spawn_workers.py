"""A script that starts its own ranks with torch.multiprocessing, ImageNet-example style: one process per
GPU (`python spawn_workers.py`), or `--gpus N` processes."""

import argparse

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main_worker(gpu: int, ngpus_per_node: int, args: argparse.Namespace) -> None:
    rank = args.rank * ngpus_per_node + gpu
    dist.init_process_group(backend=args.dist_backend, init_method=args.dist_url, world_size=args.world_size, rank=rank)
    torch.manual_seed(0)
    model = DDP(nn.Linear(6, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    inputs = torch.randn(64, 6)
    dataset = TensorDataset(inputs, (inputs[:, 0] > 0).long())
    sampler = DistributedSampler(dataset)  # train sampler
    loader = DataLoader(dataset, batch_size=8, sampler=sampler)
    for epoch in range(args.epochs):
        if args.set_epoch:
            sampler.set_epoch(epoch)
        for source, targets in loader:
            optimizer.zero_grad()
            F.cross_entropy(model(source), targets).backward()
            optimizer.step()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--world-size", type=int, default=1, help="number of nodes")
    parser.add_argument("--rank", type=int, default=0, help="node rank")
    parser.add_argument("--gpus", type=int, help="processes per node (default: one per GPU)")
    parser.add_argument("--dist-url", default="tcp://127.0.0.1:23456")
    parser.add_argument("--dist-backend", default="nccl")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--start-processes", action="store_true", help="start them with mp.start_processes")
    parser.add_argument("--no-set-epoch", dest="set_epoch", action="store_false")
    args = parser.parse_args()

    ngpus_per_node = torch.cuda.device_count() if args.gpus is None else args.gpus
    args.world_size = ngpus_per_node * args.world_size
    if args.start_processes:
        mp.start_processes(main_worker, nprocs=ngpus_per_node, args=(ngpus_per_node, args), start_method="spawn")
    else:
        mp.spawn(main_worker, nprocs=ngpus_per_node, args=(ngpus_per_node, args))


if __name__ == "__main__":
    main()
