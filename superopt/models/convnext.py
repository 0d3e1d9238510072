"""A ConvNeXt block as Hugging Face's ``ConvNextLayer`` writes it (for tests of the rules).

Depthwise 7x7 convolution, permute to channels-last, layer norm, linear (4x wider), GELU,
linear back, layer-scale multiply, permute back, residual add. The pointwise convolutions are
``nn.Linear`` on a channels-last image, so the optimizer sees rank-4 matmuls with a bias and a
per-channel scale after them: the layer scale folds into the second linear's weight and bias.
Not in the zoo (no published size to check it against); build it directly.

>>> import torch
>>> block = convnext_block(dim=8).eval()
>>> tuple(block(torch.randn(1, 8, 14, 14)).shape)
(1, 8, 14, 14)
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["ConvNextBlock", "convnext_block"]


class ConvNextBlock(nn.Module):
    """One ConvNeXt block (drop path is the identity at inference)."""

    def __init__(self, dim: int, layer_scale: float = 1e-6, eps: float = 1e-6):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, kernel_size=7, padding=3, groups=dim)
        self.layernorm = nn.LayerNorm(dim, eps=eps)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.layer_scale_parameter = nn.Parameter(layer_scale * torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.dwconv(x).permute(0, 2, 3, 1)
        h = self.pwconv2(self.act(self.pwconv1(self.layernorm(h))))
        h = self.layer_scale_parameter * h
        return x + h.permute(0, 3, 1, 2)


def convnext_block(dim: int = 96, seed: int = 0) -> ConvNextBlock:
    """A block with weights drawn from ``seed`` and a layer scale drawn too (a trained one is
    not the constant it starts as, and a wrong fold must not hide behind 1e-6)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        block = ConvNextBlock(dim)
        with torch.no_grad():
            block.layer_scale_parameter.uniform_(0.5, 1.5)
            block.layernorm.weight.uniform_(0.5, 1.5)
            block.layernorm.bias.normal_(0.0, 0.1)
    return block
