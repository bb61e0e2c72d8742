"""A fully connected network for 28x28 images, with lightning-hydra-template's SimpleDenseNet's
constructor: configs/model/mnist.yaml nests it as `net`, and Hydra builds it before the module."""

import torch
from torch import nn


class SimpleDenseNet(nn.Module):
    def __init__(
        self, input_size: int = 784, lin1_size: int = 256, lin2_size: int = 256, lin3_size: int = 256, output_size: int = 10
    ) -> None:
        super().__init__()
        sizes = [input_size, lin1_size, lin2_size, lin3_size]
        layers = []
        for size_in, size_out in zip(sizes, sizes[1:]):
            layers += [nn.Linear(size_in, size_out), nn.BatchNorm1d(size_out), nn.ReLU()]
        self.model = nn.Sequential(*layers, nn.Linear(lin3_size, output_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (batch, channels, height, width) -> (batch, channels * height * width)
        return self.model(x.flatten(start_dim=1))
