"""ResNet-50 and ResNeXt-50 (32x4d) in the torchvision layout.

Bottleneck v1.5: the stride of a downsampling block sits on the 3x3 conv, not on the
first 1x1 (that is what torchvision ships and what its 4.09 GMACs figure counts).
ResNeXt is the same network with grouped 3x3 convs and wider bottlenecks.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["Bottleneck", "ResNet", "resnet50", "resnext50_32x4d"]


class Bottleneck(nn.Module):
    """1x1 reduce -> 3x3 (strided, grouped) -> 1x1 expand x4, plus a projection
    shortcut (strided 1x1 conv + BN) wherever the shape changes."""

    expansion = 4

    def __init__(self, in_ch: int, planes: int, stride: int = 1, groups: int = 1, base_width: int = 64):
        super().__init__()
        width = int(planes * (base_width / 64.0)) * groups
        out_ch = planes * self.expansion
        self.conv1 = nn.Conv2d(in_ch, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, groups=groups, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_ch, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_ch)
        self.relu = nn.ReLU()
        self.downsample = None
        if stride != 1 or in_ch != out_ch:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False), nn.BatchNorm2d(out_ch)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    """7x7/2 stem, 3x3/2 max pool, four stages of bottlenecks, global average pool, fc."""

    def __init__(self, blocks: tuple[int, ...], groups: int = 1, base_width: int = 64, num_classes: int = 1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        in_ch, stages = 64, []
        for i, count in enumerate(blocks):
            planes = 64 * 2**i
            layers = []
            for j in range(count):
                stride = 2 if (i > 0 and j == 0) else 1
                layers.append(Bottleneck(in_ch, planes, stride, groups, base_width))
                in_ch = planes * Bottleneck.expansion
            stages.append(nn.Sequential(*layers))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_ch, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(self.avgpool(x).flatten(1))


def resnet50(num_classes: int = 1000) -> ResNet:
    """ResNet-50: blocks (3, 4, 6, 3), plain bottlenecks."""
    return ResNet((3, 4, 6, 3), num_classes=num_classes)


def resnext50_32x4d(num_classes: int = 1000) -> ResNet:
    """ResNeXt-50 32x4d: blocks (3, 4, 6, 3), 32 groups of width 4 in the first stage."""
    return ResNet((3, 4, 6, 3), groups=32, base_width=4, num_classes=num_classes)
