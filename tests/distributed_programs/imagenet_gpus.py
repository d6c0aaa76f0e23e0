"""ImageNet-example style: one process per GPU started with mp.spawn, `args.gpu`, NCCL over tcp://, resume onto the GPU."""

import argparse

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def build_model() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))


def main_worker(gpu: int, ngpus_per_node: int, args: argparse.Namespace) -> None:
    args.gpu = gpu
    args.rank = args.rank * ngpus_per_node + gpu
    dist.init_process_group(backend=args.dist_backend, init_method=args.dist_url, world_size=args.world_size, rank=args.rank)
    torch.manual_seed(0)
    model = build_model()
    torch.cuda.set_device(args.gpu)
    model.cuda(args.gpu)
    model = DDP(model, device_ids=[args.gpu])
    criterion = nn.CrossEntropyLoss().cuda(args.gpu)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    if args.resume:
        if args.resume_on == "gpu0":
            checkpoint = torch.load(args.resume, map_location="cuda:0")  # every rank onto GPU 0
        else:
            loc = "cuda:{}".format(args.gpu)
            checkpoint = torch.load(args.resume, map_location=loc)
        model.module.load_state_dict(checkpoint["state_dict"])
    images = torch.randn(64, 3, 8, 8)
    dataset = TensorDataset(images, torch.randint(0, 4, (64,)))
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler, num_workers=2, pin_memory=True)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        for images, target in loader:
            images = images.cuda(args.gpu, non_blocking=True)
            target = target.cuda(args.gpu, non_blocking=True)
            loss = criterion(model(images), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        torch.cuda.synchronize()
    if args.rank % ngpus_per_node == 0 and args.save:
        torch.save({"state_dict": model.module.state_dict()}, args.save)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--world-size", default=1, type=int)
    parser.add_argument("--rank", default=0, type=int)
    parser.add_argument("--dist-url", default="tcp://127.0.0.1:23456")
    parser.add_argument("--dist-backend", default="nccl")
    parser.add_argument("--epochs", default=2, type=int)
    parser.add_argument("--resume", default="")
    parser.add_argument("--resume-on", default="own", choices=["own", "gpu0"])
    parser.add_argument("--save", default="")
    args = parser.parse_args()
    ngpus_per_node = torch.cuda.device_count()
    args.world_size = ngpus_per_node * args.world_size
    mp.spawn(main_worker, nprocs=ngpus_per_node, args=(ngpus_per_node, args))


if __name__ == "__main__":
    main()
