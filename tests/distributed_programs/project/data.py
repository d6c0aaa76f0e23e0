import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def synthetic(samples: int = 64, features: int = 8) -> TensorDataset:
    generator = torch.Generator().manual_seed(1234)
    inputs = torch.randn(samples, features, generator=generator)
    return TensorDataset(inputs, (inputs.sum(dim=1) > 0).long())


def train_loader(batch_size: int, distributed: bool):
    dataset = synthetic()
    sampler = DistributedSampler(dataset, shuffle=True, seed=0) if distributed else None
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, shuffle=sampler is None), sampler
