"""Inception-v3 in the torchvision layout (299x299 input), without the auxiliary head.

The auxiliary classifier only runs in training; an eval-mode model never computes it,
so it is left out entirely (23.83M parameters instead of torchvision's 27.16M).
Each branch's convs are conv (no bias) + BatchNorm (eps 1e-3) + ReLU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["InceptionV3", "inception_v3"]


class BasicConv2d(nn.Module):
    """conv -> BN -> ReLU, the unit every Inception branch is built from."""

    def __init__(self, in_ch: int, out_ch: int, kernel, stride=1, padding=0):
        super().__init__()
        self.conv = nn.Conv2d(in_ch, out_ch, kernel, stride=stride, padding=padding, bias=False)
        self.bn = nn.BatchNorm2d(out_ch, eps=0.001)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.bn(self.conv(x)))


def _chain(*convs: BasicConv2d) -> nn.Sequential:
    return nn.Sequential(*convs)


def _pool_branch(x: torch.Tensor, conv: nn.Module) -> torch.Tensor:
    """3x3/1 average pool (zero padding counted, as torchvision) then a 1x1 conv."""
    return conv(F.avg_pool2d(x, 3, stride=1, padding=1))


class InceptionA(nn.Module):
    """35x35 block: 1x1, 1x1->5x5, 1x1->3x3->3x3, pool->1x1."""

    def __init__(self, in_ch: int, pool_features: int):
        super().__init__()
        self.branch1x1 = BasicConv2d(in_ch, 64, 1)
        self.branch5x5 = _chain(BasicConv2d(in_ch, 48, 1), BasicConv2d(48, 64, 5, padding=2))
        self.branch3x3dbl = _chain(
            BasicConv2d(in_ch, 64, 1), BasicConv2d(64, 96, 3, padding=1), BasicConv2d(96, 96, 3, padding=1)
        )
        self.branch_pool = BasicConv2d(in_ch, pool_features, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        branches = [self.branch1x1(x), self.branch5x5(x), self.branch3x3dbl(x), _pool_branch(x, self.branch_pool)]
        return torch.cat(branches, 1)


class InceptionB(nn.Module):
    """35 -> 17 grid reduction: 3x3/2, 1x1->3x3->3x3/2, 3x3/2 max pool."""

    def __init__(self, in_ch: int):
        super().__init__()
        self.branch3x3 = BasicConv2d(in_ch, 384, 3, stride=2)
        self.branch3x3dbl = _chain(
            BasicConv2d(in_ch, 64, 1), BasicConv2d(64, 96, 3, padding=1), BasicConv2d(96, 96, 3, stride=2)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.branch3x3(x), self.branch3x3dbl(x), F.max_pool2d(x, 3, stride=2)], 1)


class InceptionC(nn.Module):
    """17x17 block with factorized 7x7 convs (1x7 and 7x1) of inner width c7."""

    def __init__(self, in_ch: int, c7: int):
        super().__init__()
        row, col = dict(kernel=(1, 7), padding=(0, 3)), dict(kernel=(7, 1), padding=(3, 0))
        self.branch1x1 = BasicConv2d(in_ch, 192, 1)
        self.branch7x7 = _chain(BasicConv2d(in_ch, c7, 1), BasicConv2d(c7, c7, **row), BasicConv2d(c7, 192, **col))
        self.branch7x7dbl = _chain(
            BasicConv2d(in_ch, c7, 1), BasicConv2d(c7, c7, **col), BasicConv2d(c7, c7, **row),
            BasicConv2d(c7, c7, **col), BasicConv2d(c7, 192, **row),
        )  # fmt: skip
        self.branch_pool = BasicConv2d(in_ch, 192, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        branches = [self.branch1x1(x), self.branch7x7(x), self.branch7x7dbl(x), _pool_branch(x, self.branch_pool)]
        return torch.cat(branches, 1)


class InceptionD(nn.Module):
    """17 -> 8 grid reduction: 1x1->3x3/2, 1x1->1x7->7x1->3x3/2, 3x3/2 max pool."""

    def __init__(self, in_ch: int):
        super().__init__()
        self.branch3x3 = _chain(BasicConv2d(in_ch, 192, 1), BasicConv2d(192, 320, 3, stride=2))
        self.branch7x7x3 = _chain(
            BasicConv2d(in_ch, 192, 1), BasicConv2d(192, 192, (1, 7), padding=(0, 3)),
            BasicConv2d(192, 192, (7, 1), padding=(3, 0)), BasicConv2d(192, 192, 3, stride=2),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.branch3x3(x), self.branch7x7x3(x), F.max_pool2d(x, 3, stride=2)], 1)


class InceptionE(nn.Module):
    """8x8 block whose 3x3 branches fan out into parallel 1x3 and 3x1 convs."""

    def __init__(self, in_ch: int):
        super().__init__()
        self.branch1x1 = BasicConv2d(in_ch, 320, 1)
        self.branch3x3_1 = BasicConv2d(in_ch, 384, 1)
        self.branch3x3_2a = BasicConv2d(384, 384, (1, 3), padding=(0, 1))
        self.branch3x3_2b = BasicConv2d(384, 384, (3, 1), padding=(1, 0))
        self.branch3x3dbl_1 = BasicConv2d(in_ch, 448, 1)
        self.branch3x3dbl_2 = BasicConv2d(448, 384, 3, padding=1)
        self.branch3x3dbl_3a = BasicConv2d(384, 384, (1, 3), padding=(0, 1))
        self.branch3x3dbl_3b = BasicConv2d(384, 384, (3, 1), padding=(1, 0))
        self.branch_pool = BasicConv2d(in_ch, 192, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.branch3x3_1(x)
        b = self.branch3x3dbl_2(self.branch3x3dbl_1(x))
        branches = [
            self.branch1x1(x),
            torch.cat([self.branch3x3_2a(a), self.branch3x3_2b(a)], 1),
            torch.cat([self.branch3x3dbl_3a(b), self.branch3x3dbl_3b(b)], 1),
            _pool_branch(x, self.branch_pool),
        ]
        return torch.cat(branches, 1)


class InceptionV3(nn.Module):
    """Stem (five convs, two max pools), 3xA, B, 4xC, D, 2xE, global pool, fc 2048->classes."""

    def __init__(self, num_classes: int = 1000):
        super().__init__()
        self.stem = nn.Sequential(
            BasicConv2d(3, 32, 3, stride=2), BasicConv2d(32, 32, 3), BasicConv2d(32, 64, 3, padding=1),
            nn.MaxPool2d(3, stride=2), BasicConv2d(64, 80, 1), BasicConv2d(80, 192, 3), nn.MaxPool2d(3, stride=2),
        )  # fmt: skip
        self.blocks = nn.Sequential(
            InceptionA(192, 32), InceptionA(256, 64), InceptionA(288, 64), InceptionB(288),
            InceptionC(768, 128), InceptionC(768, 160), InceptionC(768, 160), InceptionC(768, 192),
            InceptionD(768), InceptionE(1280), InceptionE(2048),
        )  # fmt: skip
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(0.5)
        self.fc = nn.Linear(2048, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.avgpool(self.blocks(self.stem(x)))
        return self.fc(self.dropout(x.flatten(1)))


def inception_v3(num_classes: int = 1000) -> InceptionV3:
    """Inception-v3 for 299x299 inputs, eval-mode layout (no aux logits)."""
    return InceptionV3(num_classes)
