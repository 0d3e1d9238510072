"""Lowering of every operator to torch calls.

Each entry is ``fn(attrs, *tensors)``, plain torch functions that ``torch.fx`` and
``torch.export`` can trace: the code generator builds its FX graphs from these, and the GPU
profiler times them. Constants are created in float32 on the CPU unless given ``dtype=`` and
``device=`` keywords, as ``run`` does.
"""

from __future__ import annotations

import json
from typing import Mapping

import torch
import torch.nn.functional as F

from ..ir.graph import Graph
from .interpret import SemanticsError, interpret

__all__ = ["LOWERING", "run", "identity_conv_tensor", "register_opaque", "resolve_opaque", "decode_params"]


def identity_conv_tensor(channels, kernel, groups, **like):
    kh, kw = kernel
    per = channels // groups
    w = torch.zeros(channels, per, kh, kw, **like)
    idx = torch.arange(channels)
    w[idx, idx % per, kh // 2, kw // 2] = 1.0
    return w


def _conv2d(a, x, w, b=None):  # conv2d, and conv2d_bias with its bias b
    y = F.conv2d(x, w, b, a["stride"], a["padding"], 1, a["groups"])
    return torch.relu(y) if a["activation"] == "relu" else y


def _enlarge(a, w):
    dh, dw = (a["kernel"][0] - w.shape[2]) // 2, (a["kernel"][1] - w.shape[3]) // 2
    return F.pad(w, (dw, dw, dh, dh))


def _batchnorm(a, x, scale, bias, mean, var):
    return F.batch_norm(x, mean, var, scale, bias, False, 0.0, a["eps"])


def _layernorm(a, x):
    return F.layer_norm(x, tuple(x.shape[x.dim() - a["ndim"]:]), None, None, a["eps"])


def _sdpa(a, q, k, v, mask=None):
    if a["gqa"]:  # torch >= 2.5
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=bool(a["causal"]), scale=a["scale"],
                                              enable_gqa=True)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=bool(a["causal"]), scale=a["scale"])


def _slice(a, x):
    return torch.ops.aten.slice.Tensor(x, a["axis"], a["start"], a["end"], a["step"])


def _mask_bias(a, m, dtype=None):
    """0 where ``m`` holds, -inf elsewhere; ``zeros_like`` so that an exported program makes it
    on the mask's device wherever it runs (not the device it was traced on)."""
    dt = dtype or getattr(torch, a["dtype"])
    return torch.zeros_like(m, dtype=dt).masked_fill(~m.bool(), float("-inf"))


def _cast(a, x, floating=None):
    """``x.to(dtype)``; ``floating`` (what ``run`` evaluates floats in) replaces a float target,
    so that a float64 run stays float64 through RMSNorm's upcast."""
    return x.to(floating or getattr(torch, a["dtype"]))


def _split(a, x):
    return tuple(torch.split(x, list(a["sizes"]), dim=a["axis"]))


#: opaque targets that superopt can call back, by name (importers register what they keep)
OPAQUE_CALLS: dict[str, object] = {}


def register_opaque(target: str, fn) -> None:
    """Make an opaque node's ``target`` callable: ``fn(*tensors, **params)``."""
    OPAQUE_CALLS[target] = fn


def resolve_opaque(target: str):
    """The callable behind an opaque target that is not registered: an operator overload
    (``"aten.mean.dim"`` -> ``torch.ops.aten.mean.dim``) or a function under ``torch``
    (``"torch.nn.functional.local_response_norm"``); None when there is none."""
    head, _, rest = target.partition(".")
    obj = torch if head == "torch" else getattr(torch.ops, head, None) if rest.count(".") == 1 else None
    for part in rest.split(".") if obj is not None else ():
        obj = getattr(obj, part, None)
    return obj if callable(obj) else None


def decode_params(value, tensors):
    """Rebuild a call argument from its JSON form: ``{"$t": i}`` is the i-th tensor input,
    ``{"$dtype": ..}``, ``{"$memory_format": ..}``, ``{"$layout": ..}`` name torch objects."""
    if isinstance(value, list):
        return [decode_params(v, tensors) for v in value]
    if isinstance(value, dict):
        if "$t" in value:
            return tensors[value["$t"]]
        if len(value) == 1 and next(iter(value)).startswith("$"):
            return getattr(torch, next(iter(value.values())))
        return {k: decode_params(v, tensors) for k, v in value.items()}
    return value


def _opaque(a, *xs):
    """Call an opaque node as it came: a registered ``fn(*tensors, **params)``, or an operator
    resolved by :func:`resolve_opaque` on params ``{"args": [...], "kwargs": {...}}``."""
    target, params = a["target"], json.loads(a["params"])
    fn = OPAQUE_CALLS.get(target)
    if fn is not None:
        out = fn(*xs, **params)
    else:
        fn = resolve_opaque(target)
        if fn is None:
            raise SemanticsError(f"opaque call {target!r} has no torch implementation: it is not a torch "
                                 f"operator; register one with superopt.semantics.torch_lowering.register_opaque")
        args, kwargs = decode_params(params.get("args", []), xs), decode_params(params.get("kwargs", {}), xs)
        out = fn(*args, **kwargs)
    return tuple(out) if isinstance(out, (list, tuple)) else out


LOWERING = {
    # constants take optional dtype= and device= keywords (float32 on the CPU by default)
    "identity_matrix": lambda a, **like: torch.eye(a["n"], **like),
    "identity_conv": lambda a, **like: identity_conv_tensor(a["channels"], a["kernel"], a["groups"], **like),
    "ones": lambda a, **like: torch.ones(a["shape"], **like),
    "zeros": lambda a, **like: torch.zeros(a["shape"], **like),
    "pool_kernel": lambda a, **like: torch.full((a["channels"], 1) + tuple(a["kernel"]),
                                                1.0 / (a["kernel"][0] * a["kernel"][1]), **like),
    "add": lambda a, x, y: torch.add(x, y),
    "mul": lambda a, x, y: torch.mul(x, y),
    "smul": lambda a, x, s: torch.mul(x, s),
    "relu": lambda a, x: torch.relu(x),
    "sigmoid": lambda a, x: torch.sigmoid(x),
    "tanh": lambda a, x: torch.tanh(x),
    "gelu": lambda a, x: F.gelu(x),
    "matmul": lambda a, x, y: torch.matmul(x, y),
    "conv2d": _conv2d,
    "conv2d_bias": _conv2d,
    "enlarge": _enlarge,
    "transpose": lambda a, x: x.permute(a["perm"]),
    "reshape": lambda a, x: x.reshape(a["shape"]),
    "concat": lambda a, *xs: torch.cat(xs, dim=a["axis"]),
    "split": _split,
    "avgpool2d": lambda a, x: F.avg_pool2d(x, a["kernel"], a["stride"], a["padding"], count_include_pad=True),
    "maxpool2d": lambda a, x: F.max_pool2d(x, a["kernel"], a["stride"], a["padding"]),
    "batchnorm": _batchnorm,
    "softmax": lambda a, x: torch.softmax(x, a["axis"]),
    "layernorm": _layernorm,
    "sdpa": _sdpa,
    "embedding": lambda a, w, ids: F.embedding(ids.long(), w),
    "pow": lambda a, x: torch.pow(x, a["exponent"]),
    "mean": lambda a, x: torch.mean(x, a["axis"], keepdim=bool(a["keepdim"])),
    "sum": lambda a, x: torch.sum(x, a["axis"], keepdim=bool(a["keepdim"])),
    "rsqrt": lambda a, x: torch.rsqrt(x),
    "silu": lambda a, x: F.silu(x),
    "cos": lambda a, x: torch.cos(x),
    "sin": lambda a, x: torch.sin(x),
    "gelu_tanh": lambda a, x: F.gelu(x, approximate="tanh"),
    "clamp": lambda a, x: torch.clamp(x, a["lo"], a["hi"]),
    "cast": _cast,
    "expand": lambda a, x: x.expand(a["shape"]),
    "slice": _slice,
    "index_copy": lambda a, x, ids, src: torch.index_copy(x, a["axis"], ids.long(), src),
    "compare": lambda a, x, y: getattr(torch, a["cmp"])(x, y),
    "logical": lambda a, x, y: (torch.logical_and if a["fn"] == "and" else torch.logical_or)(x.bool(), y.bool()),
    "mask_bias": _mask_bias,
    "opaque": _opaque,
}


def _dtype_for(declared: str | None, default: torch.dtype) -> torch.dtype:
    return getattr(torch, declared) if declared in ("int64", "int32", "bool") else default


def run(g: Graph, env: Mapping[str, torch.Tensor] | None = None, device="cpu", dtype=torch.float32) -> list:
    """Evaluate with torch eagerly (weights from the graph's data, converted to ``dtype``; sources
    of an integer or boolean type keep it)."""
    declared = {g.nodes[i].name: g.nodes[i].types[0].dtype for i in g.inputs + g.weights}
    env = {k: torch.as_tensor(v).to(device=device, dtype=_dtype_for(declared.get(k), dtype))
           for k, v in (env or {}).items()}
    table = dict(LOWERING)
    for name in ("identity_matrix", "identity_conv", "ones", "zeros", "pool_kernel"):
        table[name] = (lambda f: lambda a: f(a, device=device, dtype=dtype))(LOWERING[name])
    table["cast"] = lambda a, x: _cast(a, x, dtype)
    table["mask_bias"] = lambda a, m: _mask_bias(a, m, dtype)
    return interpret(g, env, table, "torch", lambda d: torch.as_tensor(d).to(device=device, dtype=dtype))
