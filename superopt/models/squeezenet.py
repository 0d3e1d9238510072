"""SqueezeNet 1.1 (torchvision layout): 3x3/2 stem conv, eight Fire modules, conv classifier."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["Fire", "SqueezeNet", "squeezenet1_1"]


class Fire(nn.Module):
    """1x1 squeeze, then 1x1 and 3x3 expands side by side, concatenated on channels."""

    def __init__(self, in_ch: int, squeeze: int, expand1x1: int, expand3x3: int):
        super().__init__()
        self.squeeze = nn.Conv2d(in_ch, squeeze, 1)
        self.expand1x1 = nn.Conv2d(squeeze, expand1x1, 1)
        self.expand3x3 = nn.Conv2d(squeeze, expand3x3, 3, padding=1)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.relu(self.squeeze(x))
        return torch.cat([self.relu(self.expand1x1(s)), self.relu(self.expand3x3(s))], 1)


class SqueezeNet(nn.Module):
    """SqueezeNet 1.1: the max pools use ceil_mode, as in the reference Caffe model."""

    def __init__(self, num_classes: int = 1000):
        super().__init__()
        pool = lambda: nn.MaxPool2d(3, stride=2, ceil_mode=True)  # noqa: E731
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, 3, stride=2), nn.ReLU(), pool(),
            Fire(64, 16, 64, 64), Fire(128, 16, 64, 64), pool(),
            Fire(128, 32, 128, 128), Fire(256, 32, 128, 128), pool(),
            Fire(256, 48, 192, 192), Fire(384, 48, 192, 192),
            Fire(384, 64, 256, 256), Fire(512, 64, 256, 256),
        )  # fmt: skip
        self.classifier = nn.Sequential(
            nn.Dropout(0.5), nn.Conv2d(512, num_classes, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x)).flatten(1)


def squeezenet1_1(num_classes: int = 1000) -> SqueezeNet:
    """SqueezeNet 1.1 at the default 1000 classes."""
    return SqueezeNet(num_classes)
