"""Handing code to Inductor, for the ``torch.compile`` backend (:mod:`superopt.driver.backend`):
weights made constants of the module (as Inductor's freezing does), and Inductor's compile with
the mode's settings and, where the driver chose one, the convolution layout.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch._inductor.compile_fx as inductor_compile
from torch._inductor import list_mode_options

__all__ = ["is_weight", "freeze", "compile_inductor", "tuple_output"]


def is_weight(x) -> bool:
    """A parameter or a buffer dynamo marked static: a weight of the model."""
    return isinstance(x, torch.nn.Parameter) or getattr(x, "_dynamo_static_input_type", None) is not None


def freeze(gm: torch.fx.GraphModule, inputs: Sequence) -> tuple[torch.fx.GraphModule, list[int]]:
    """A copy of ``gm`` whose weight inputs are buffers; the positions of the remaining inputs."""
    graph = torch.fx.Graph()
    env: dict = {}
    root = torch.nn.Module()
    user: list[int] = []
    pos = 0
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            x = inputs[pos]
            if is_weight(x):
                name = f"w{pos}"
                root.register_buffer(name, x.detach())
                env[node] = graph.get_attr(name)
            else:
                env[node] = graph.placeholder(node.name)
                user.append(pos)
            pos += 1
        else:
            env[node] = graph.node_copy(node, lambda n: env[n])
    for name, mod in gm.named_children():
        root.add_module(name, mod)
    for name, buf in gm.named_buffers(recurse=False):
        root.register_buffer(name, buf)
    for name, p in gm.named_parameters(recurse=False):
        root.register_parameter(name, p)
    return torch.fx.GraphModule(root, graph), user


def tuple_output(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``gm`` returning a tuple (what dynamo's graphs return), even for one output."""
    out = next(n for n in gm.graph.nodes if n.op == "output")
    if not isinstance(out.args[0], (tuple, list)):
        out.args = ((out.args[0],),)
        gm.recompile()
    return gm


def compile_inductor(gm: torch.fx.GraphModule, inputs: list, mode: str | None = None,
                     freezing: bool | None = None, channels_last: bool | None = None) -> Callable:
    """Inductor's compile of ``gm`` with ``mode``'s settings, as ``torch.compile(mode=...)``
    makes them; ``freezing`` and ``channels_last`` (Inductor's layout optimization on or off)
    are set only where given (None: Inductor's own configuration decides)."""
    patches = dict(list_mode_options(mode) if mode else {})
    if freezing is not None:
        patches["freezing"] = freezing
    if channels_last is not None:
        patches["layout_optimization"] = patches["force_layout_optimization"] = channels_last
    return inductor_compile.compile_fx(gm, inputs, config_patches=patches)
