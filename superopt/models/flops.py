"""Counting the multiply-adds of a model, reported as FLOPs = 2 x MACs.

Only convolutions and matrix products are counted (aten.convolution, mm, addmm, bmm,
baddbmm): they are what the published figures count, and everything else (norms,
activations, pooling, softmax, bias adds) is a rounding error next to them.

The counter is a TorchDispatchMode, so it sees the ops after the composite ones
(linear, matmul, conv2d, einsum) were decomposed: a 3-d ``linear`` arrives as an
``addmm`` on a flattened view, a 4-d ``matmul`` as a ``bmm``. It counts what really
runs, whatever Python-level modules the model uses.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["count_flops", "count_macs"]

_aten = torch.ops.aten


def _conv_macs(args, out) -> int:
    """MACs of aten.convolution: every output (or, transposed, input) element
    takes Cin/groups x prod(kernel) products; ``weight.shape[1]`` is that Cin/groups
    for a plain conv and Cout/groups for a transposed one."""
    x, weight, transposed = args[0], args[1], bool(args[6])
    per_elem = weight.shape[1] * math.prod(weight.shape[2:])
    return (x.numel() if transposed else out.numel()) * per_elem


def _matmul_macs(first: torch.Tensor, out: torch.Tensor) -> int:
    """MACs of (batched) A @ B: every output element is a dot product of length K."""
    return out.numel() * first.shape[-1]


_RULES = {
    _aten.convolution: _conv_macs,
    _aten.mm: lambda args, out: _matmul_macs(args[0], out),
    _aten.bmm: lambda args, out: _matmul_macs(args[0], out),
    _aten.addmm: lambda args, out: _matmul_macs(args[1], out),
    _aten.baddbmm: lambda args, out: _matmul_macs(args[1], out),
    # Composite ops normally decompose before reaching the mode; kept in case a
    # backend routes them here whole (the mode then never sees their insides).
    _aten.matmul: lambda args, out: _matmul_macs(args[0], out),
    _aten.linear: lambda args, out: _matmul_macs(args[0], out),
}


class _MacCounter(TorchDispatchMode):
    """Sums the MACs of every counted op that runs while the mode is active."""

    def __init__(self) -> None:
        super().__init__()
        self.macs = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        rule = _RULES.get(func.overloadpacket)
        if rule is not None:
            self.macs += int(rule(args, out))
        return out


def count_macs(module: torch.nn.Module, inputs: Sequence[torch.Tensor] | torch.Tensor) -> int:
    """Multiply-accumulates of one forward pass of ``module`` on ``inputs`` (run for real,
    without autograd)."""
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    counter = _MacCounter()
    with torch.no_grad(), counter:
        module(*inputs)
    return counter.macs


def count_flops(module: torch.nn.Module, inputs: Sequence[torch.Tensor] | torch.Tensor) -> int:
    """FLOPs of one forward pass, by the convention FLOPs = 2 x multiply-adds of the conv
    and matmul/linear layers. (Many papers and torchvision's "GFLOPS" column publish the
    multiply-add count itself; divide by 2 to compare with those.)"""
    return 2 * count_macs(module, inputs)
