"""``superopt::conv2d_relu``: a convolution, its bias, a residual and the ReLU after them as one
cuDNN call.

Inductor runs a convolution as a cuDNN call and the bias, residual add and ReLU after it as a
Triton kernel of their own. cuDNN's fused engines (``torch.cudnn_convolution_relu`` and
``torch.cudnn_convolution_add_relu``: ``relu(conv(x, w) + alpha * z + b)``) run them in the
convolution's epilogue. On an H100 under reduce-overhead with freezing, ResNet-50 at batch 1 in
bf16 went from 106 kernels to 62 and ran 1.15x faster (NCHW float32: 224 to 73 kernels, 1.05x).

It is a ``torch.library`` custom operator, so that dynamo, fake tensors and Inductor see one
opaque call (Inductor calls it as an extern kernel, inside CUDA graphs too). It takes inputs in
any layout (``flexible_layout``: Inductor need not copy its channels-last tensors back into the
strides the graph was traced with; such copies made NASNet-A 7% slower). Its output is in
the memory format the call is told (``channels_last``) with the canonical strides, which its
fake implementation gives as well; without CUDA and cuDNN, or when cuDNN refuses the shapes,
it runs the reference: ``conv2d``, the adds and ``relu``.
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["conv2d_relu", "conv2d", "reference_conv2d_relu"]


def _format(channels_last: bool):
    return torch.channels_last if channels_last else torch.contiguous_format


def _out_shape(x: torch.Tensor, weight: torch.Tensor, stride, padding) -> tuple:
    n, _, h, w = x.shape
    co, _, kh, kw = weight.shape
    return (n, co, (h + 2 * padding[0] - kh) // stride[0] + 1, (w + 2 * padding[1] - kw) // stride[1] + 1)


def reference_conv2d_relu(x, weight, bias, residual, stride, padding, groups) -> torch.Tensor:
    """What the fused call computes, op by op."""
    y = torch.nn.functional.conv2d(x, weight, bias, stride, padding, 1, groups)
    return torch.relu(y if residual is None else y + residual)


def _canonical(y: torch.Tensor, channels_last: bool) -> torch.Tensor:
    """``y`` in the memory format with exactly the strides ``torch.empty`` gives it (dims of
    size 1 may carry any stride; the fake implementation and Inductor's checks expect these)."""
    fmt = _format(channels_last)
    y = y.contiguous(memory_format=fmt)
    want = torch.empty(y.shape, device="meta", memory_format=fmt).stride()
    return y if y.stride() == want else y.as_strided(y.shape, want, y.storage_offset())


@torch.library.custom_op("superopt::conv2d_relu", mutates_args=(), tags=(torch.Tag.flexible_layout,))
def conv2d_relu(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], residual: Optional[torch.Tensor],
                stride: list[int], padding: list[int], groups: int, channels_last: bool) -> torch.Tensor:
    """``relu(conv2d(x, weight, bias) [+ residual])`` in one cuDNN call where there is one."""
    y = None
    if x.is_cuda and torch.backends.cudnn.is_available() and torch.backends.cudnn.enabled:
        fmt = _format(channels_last)
        xs, ws = x.contiguous(memory_format=fmt), weight.contiguous(memory_format=fmt)
        try:
            if residual is None:
                y = torch.cudnn_convolution_relu(xs, ws, bias, stride, padding, [1, 1], groups)
            else:
                y = torch.cudnn_convolution_add_relu(xs, ws, residual.contiguous(memory_format=fmt), 1.0, bias,
                                                     stride, padding, [1, 1], groups)
        except RuntimeError:  # no fused engine for these shapes: the reference below
            y = None
    if y is None:
        y = reference_conv2d_relu(x, weight, bias, residual, stride, padding, groups)
    return _canonical(y, channels_last)


@conv2d_relu.register_fake
def _conv2d_relu_fake(x, weight, bias, residual, stride, padding, groups, channels_last):
    return torch.empty(_out_shape(x, weight, stride, padding), dtype=x.dtype, device=x.device,
                       memory_format=_format(channels_last))


@torch.library.custom_op("superopt::conv2d", mutates_args=(), tags=(torch.Tag.flexible_layout,))
def conv2d(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], stride: list[int], padding: list[int],
           groups: int, channels_last: bool) -> torch.Tensor:
    """A plain convolution in the memory format the driver chose (``channels_last``).

    Written where the chosen layout differs from the one Inductor's own rule would pick for the
    program: Inductor's layout optimization looks only at ``aten.convolution`` calls, so with
    every convolution a superopt call, a user's plain ``torch.compile`` of the written program
    runs the layout the driver priced (and the ``torch.compile`` backend, which sets the layout
    itself, runs the same code). The same cuDNN call as ``F.conv2d``.
    """
    fmt = _format(channels_last)
    y = torch.nn.functional.conv2d(x.contiguous(memory_format=fmt), weight.contiguous(memory_format=fmt), bias,
                                   stride, padding, 1, groups)
    return _canonical(y, channels_last)


@conv2d.register_fake
def _conv2d_fake(x, weight, bias, stride, padding, groups, channels_last):
    return torch.empty(_out_shape(x, weight, stride, padding), dtype=x.dtype, device=x.device,
                       memory_format=_format(channels_last))
