import torch
from torch import nn


class Classifier(nn.Module):
    def __init__(self, features: int = 8, hidden: int = 16, classes: int = 2) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(features, hidden), nn.ReLU())
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))
