"""NASNet-A Mobile (4 @ 1056) for 224x224 inputs, after Zoph et al. 2018 and the
TF-slim reference (nasnet.py / nasnet_utils.py, mobile_imagenet_config).

The two cell types are written as tables (operation, input state) exactly as the
search produced them, and one generic :class:`Cell` interprets a table. Layout:
3x3/2 stem conv (32, no padding), two reduction "stem" cells (11 and 22 filters per
branch), then 3 stacks of 4 normal cells (44, 88, 176 filters) with a reduction cell
between stacks, ReLU, global average pool, dropout, fc 1056 -> classes. The
auxiliary head (training only) is omitted.

Each separable op is two stacked (ReLU -> depthwise kxk -> pointwise 1x1 -> BN)
layers. Average pools count padded zeros (PyTorch default; TF's SAME pools do not):
this changes values at borders, not structure or FLOPs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Genotype", "NORMAL_CELL", "REDUCTION_CELL", "Cell", "NASNetAMobile", "nasnet_a_mobile"]


@dataclass(frozen=True)
class Genotype:
    """A NASNet cell: 5 combiners, each adding op[2i](states[inputs[2i]]) and
    op[2i+1](states[inputs[2i+1]]). States 0/1 are the cell's two inputs (current and
    previous layer), state 2+i is combiner i. Outputs are the concat of the states
    that ``used`` marks 0 (states no combiner consumed, plus state 1 for normal cells,
    as in TF-slim)."""

    ops: tuple[str, ...]
    inputs: tuple[int, ...]
    used: tuple[int, ...]


NORMAL_CELL = Genotype(
    ops=("sep5", "sep3", "sep5", "sep3", "avg", "none", "avg", "avg", "sep3", "none"),
    inputs=(0, 1, 1, 1, 0, 1, 1, 1, 0, 0),
    used=(1, 0, 0, 0, 0, 0, 0),
)
REDUCTION_CELL = Genotype(
    ops=("sep5", "sep7", "max", "sep7", "avg", "sep5", "none", "avg", "sep3", "max"),
    inputs=(0, 1, 0, 1, 0, 1, 3, 2, 2, 0),
    used=(1, 1, 1, 0, 0, 0, 0),
)


def _bn(ch: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(ch, eps=0.001)


class ReluConvBN(nn.Module):
    """ReLU -> kxk conv (no bias) -> BN: the 1x1 input adapters of a cell."""

    def __init__(self, in_ch: int, out_ch: int, stride: int = 1):
        super().__init__()
        self.relu = nn.ReLU()
        self.conv = nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False)
        self.bn = _bn(out_ch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(self.relu(x)))


class SeparableLayer(nn.Module):
    """ReLU -> depthwise kxk (stride s) -> pointwise 1x1 -> BN."""

    def __init__(self, in_ch: int, out_ch: int, kernel: int, stride: int):
        super().__init__()
        self.relu = nn.ReLU()
        self.depthwise = nn.Conv2d(in_ch, in_ch, kernel, stride, kernel // 2, groups=in_ch, bias=False)
        self.pointwise = nn.Conv2d(in_ch, out_ch, 1, bias=False)
        self.bn = _bn(out_ch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.pointwise(self.depthwise(self.relu(x))))


class Pool(nn.Module):
    """3x3 max or average pool (padding 1), then a 1x1 conv + BN if the width must change."""

    def __init__(self, kind: str, in_ch: int, out_ch: int, stride: int):
        super().__init__()
        self.kind, self.stride = kind, stride
        self.project = None
        if in_ch != out_ch:
            self.project = nn.Sequential(nn.Conv2d(in_ch, out_ch, 1, bias=False), _bn(out_ch))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pool = F.max_pool2d if self.kind == "max" else F.avg_pool2d
        x = pool(x, 3, stride=self.stride, padding=1)
        return x if self.project is None else self.project(x)


class FactorizedReduction(nn.Module):
    """ReLU, then two 1x1 convs on the even and the odd (shifted-by-one) pixels of a
    stride-2 grid, concatenated and batch-normed: halves the resolution without
    dropping half the input as a plain strided 1x1 would. The shift needs a zero pad
    and a slice; no other op in the zoo does."""

    def __init__(self, in_ch: int, out_ch: int):
        super().__init__()
        self.relu = nn.ReLU()
        self.path1 = nn.Conv2d(in_ch, out_ch // 2, 1, bias=False)
        self.path2 = nn.Conv2d(in_ch, out_ch - out_ch // 2, 1, bias=False)
        self.bn = _bn(out_ch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(x)
        even = self.path1(F.avg_pool2d(x, 1, stride=2))
        odd = self.path2(F.avg_pool2d(F.pad(x, (0, 1, 0, 1))[:, :, 1:, 1:], 1, stride=2))
        return self.bn(torch.cat([even, odd], 1))


def _make_op(name: str, in_ch: int, out_ch: int, stride: int) -> nn.Module:
    """One cell operation, TF-slim ``_apply_conv_operation``."""
    if name.startswith("sep"):
        k = int(name[3:])
        return nn.Sequential(SeparableLayer(in_ch, out_ch, k, stride), SeparableLayer(out_ch, out_ch, k, 1))
    if name in ("avg", "max"):
        return Pool(name, in_ch, out_ch, stride)
    if name == "none":
        return nn.Identity() if stride == 1 and in_ch == out_ch else ReluConvBN(in_ch, out_ch, stride)
    raise ValueError(f"unknown NASNet operation {name!r}")


class Cell(nn.Module):
    """A normal (stride 1) or reduction (stride 2) cell interpreting a :class:`Genotype`.

    ``prev_adapter`` brings the previous layer to ``filters`` channels at the current
    resolution; ``prev_ch`` is its output width (the stem's first cell feeds the raw
    stem conv through unchanged, TF-slim's ``prev_layer=None`` case).
    """

    def __init__(
        self, genotype: Genotype, in_ch: int, prev_adapter: nn.Module, prev_ch: int, filters: int, stride: int
    ):
        super().__init__()
        self.inputs, self.used = genotype.inputs, genotype.used
        self.base = ReluConvBN(in_ch, filters)
        self.prev_adapter = prev_adapter
        widths = [filters, prev_ch] + [filters] * (len(genotype.ops) // 2)
        ops = []
        for op, src in zip(genotype.ops, genotype.inputs):
            ops.append(_make_op(op, widths[src], filters, stride if src < 2 else 1))
        self.ops = nn.ModuleList(ops)
        self.out_channels = filters * (len(genotype.used) - sum(genotype.used))

    def forward(self, x: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        states = [self.base(x), self.prev_adapter(prev)]
        for i in range(0, len(self.ops), 2):
            left = self.ops[i](states[self.inputs[i]])
            states.append(left + self.ops[i + 1](states[self.inputs[i + 1]]))
        return torch.cat([s for s, used in zip(states, self.used) if not used], 1)


def _adapter(prev: tuple[int, int] | None, cur: tuple[int, int], filters: int) -> tuple[nn.Module, int]:
    """TF-slim ``_reduce_prev_layer``: (channels, resolution level) of the previous and
    current layers -> the module fitting the previous layer to the cell, and its width."""
    if prev is None:
        return nn.Identity(), cur[0]
    if prev[1] != cur[1]:
        return FactorizedReduction(prev[0], filters), filters
    if prev[0] != filters:
        return ReluConvBN(prev[0], filters), filters
    return nn.Identity(), filters


class NASNetAMobile(nn.Module):
    """NASNet-A with N normal cells per stack and ``penultimate_filters`` output width."""

    def __init__(self, num_classes: int = 1000, penultimate_filters: int = 1056, cells_per_stack: int = 4):
        super().__init__()
        filters = penultimate_filters // 24  # 6 branches x 4x widening over 3 stacks
        self.conv0 = nn.Sequential(nn.Conv2d(3, 32, 3, stride=2, bias=False), _bn(32))
        # (genotype, filters, stride) for every cell in order
        plan = [(REDUCTION_CELL, filters // 4, 2), (REDUCTION_CELL, filters // 2, 2)]
        for stack in range(3):
            if stack > 0:
                plan.append((REDUCTION_CELL, filters * 2**stack, 2))
            plan += [(NORMAL_CELL, filters * 2**stack, 1)] * cells_per_stack
        outs: list[tuple[int, int] | None] = [None, (32, 0)]  # (channels, resolution level)
        cells = []
        for genotype, width, stride in plan:
            adapter, prev_ch = _adapter(outs[-2], outs[-1], width)
            cell = Cell(genotype, outs[-1][0], adapter, prev_ch, width, stride)
            cells.append(cell)
            outs.append((cell.out_channels, outs[-1][1] + (stride == 2)))
        self.cells = nn.ModuleList(cells)
        self.relu = nn.ReLU()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(0.5)
        self.fc = nn.Linear(outs[-1][0], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv0(x)
        prev = x  # the first stem cell has no previous layer: it sees the stem conv twice
        for cell in self.cells:
            x, prev = cell(x, prev), x
        x = self.avgpool(self.relu(x)).flatten(1)
        return self.fc(self.dropout(x))


def nasnet_a_mobile(num_classes: int = 1000) -> NASNetAMobile:
    """NASNet-A Mobile 4 @ 1056 (the paper's 564M mult-add, 5.3M parameter model)."""
    return NASNetAMobile(num_classes)
