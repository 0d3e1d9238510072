"""Random small ``torch.nn.Module`` s for the fuzz harness (``tests/test_fuzz.py``, ``scripts/fuzz.py``).

A model is a deterministic function of its seed: :func:`build` returns the module in eval mode
and its example call ``(args, kwargs)``. Layers are drawn from what real models use: convolutions
with and without bias, batch norm, pooling, linear layers sharing an input (so sibling merges
happen), residuals, concat/split, transposes/reshapes, layer norm, softmax, attention written as
matmul + softmax, broadcasting against parameters and against other inputs, several inputs of
different shapes, some given by keyword, outputs as a tensor, a tuple or a dict (now and then
upcast with ``.float()``), and state the model holds and updates in place (a running average, a
cache written at a position: buffers). And the pieces of an LLM as Hugging Face writes them:
RMSNorm with its float32 upcast, SwiGLU, tanh-GELU, attention through SDPA with grouped key-value
heads (``expand`` + ``reshape``, ``repeat_interleave`` or ``enable_gqa``), rotary embeddings whose
tables are computed from positions in float32 and cast back, and masks (causal, a buffer of rank
2 or 4, or built from positions).
"""

from __future__ import annotations

import math
import random

import torch
from torch import nn
import torch.nn.functional as F

__all__ = ["build", "FuzzModel"]


class FuzzModel(nn.Module):
    """Runs a list of steps ``(op, input slots, extra)`` over a growing list of values."""

    def __init__(self, steps, outputs, out_kind, mods, upcast: bool = False):
        super().__init__()
        self.steps, self.outputs, self.out_kind, self.upcast = steps, outputs, out_kind, upcast
        self.mods = nn.ModuleList(mods)

    def forward(self, x0, x1=None, x2=None):
        vals = [v for v in (x0, x1, x2) if v is not None]
        for op, ins, extra in self.steps:
            vals.append(_apply(self, op, [vals[i] for i in ins], extra))
        outs = [vals[i].float() if self.upcast else vals[i] for i in self.outputs]   # (logits.float())
        if self.out_kind == "dict":
            return {f"out{k}": o for k, o in enumerate(outs)}
        return outs[0] if self.out_kind == "tensor" else tuple(outs)


def _apply(m, op, xs, extra):
    x = xs[0]
    if op == "mod":
        return m.mods[extra](x)
    if op == "act":
        return {"relu": torch.relu, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "gelu": F.gelu,
                "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "silu": F.silu,
                "gelu_tanh_written": lambda t: 0.5 * t * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi)
                                                                          * (t + 0.044715 * torch.pow(t, 3.0))))}[extra](x)
    if op == "add":
        return x + xs[1]
    if op == "mul":
        return x * xs[1]
    if op == "param_mul":
        return x * m.mods[extra].weight
    if op == "cat":
        return torch.cat(xs, dim=extra)
    if op == "split":
        axis, k = extra
        return torch.split(x, x.shape[axis] // 2, dim=axis)[k]
    if op == "softmax":
        return torch.softmax(x, dim=-1)
    if op == "transpose2":
        return x.transpose(-1, -2)
    if op == "flatten":
        return x.flatten(2).transpose(1, 2)  # (N, C, H, W) -> (N, HW, C)
    if op == "attention":
        q, k, v = (m.mods[i](x) for i in extra)
        return torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1) @ v
    if op == "pool":
        return F.max_pool2d(x, 2) if extra == "max" else F.avg_pool2d(x, 2)
    if op == "average":   # a running average the model keeps (a buffer updated in place)
        st = m.mods[extra]
        st.buf.mul_(0.5).add_(x, alpha=0.5)
        return x - st.buf
    if op == "cache":     # rows written into a cache the model keeps, at fixed positions, then read whole
        st = m.mods[extra]
        st.buf.index_copy_(-2, st.pos, x)
        return st.buf.sum(-2, keepdim=True) + x
    raise AssertionError(op)


class _RMSNorm(nn.Module):
    """Hugging Face's: computed in float32, cast back to the input's dtype before the weight."""

    def __init__(self, d: int, eps: float):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.rand(d) + 0.5), eps

    def forward(self, x):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class _SwiGLU(nn.Module):
    def __init__(self, d: int, f: int, bias: bool):
        super().__init__()
        self.gate, self.up, self.down = nn.Linear(d, f, bias=bias), nn.Linear(d, f, bias=bias), nn.Linear(f, d, bias=bias)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class _Attention(nn.Module):
    """Multi-head attention through SDPA over ``[b, l, d]``: ``hk`` key-value heads shared by
    ``hq`` query heads (repeated as ``form`` says), rotary embeddings from the positions
    (``rotary``), and a mask (``mask``: none, causal, a buffer ``[l, l]`` or ``[1, 1, l, l]``, or
    built from the positions in float32 and cast to the queries' dtype)."""

    def __init__(self, d: int, l: int, hq: int, hk: int, e: int, form: str, rotary: bool, mask: str, bias: bool,
                 offset: int):
        super().__init__()
        self.hq, self.hk, self.e, self.form, self.rotary, self.mask = hq, hk, e, form, rotary, mask
        self.q, self.o = nn.Linear(d, hq * e, bias=bias), nn.Linear(hq * e, d, bias=bias)
        self.k, self.v = nn.Linear(d, hk * e, bias=bias), nn.Linear(d, hk * e, bias=bias)
        self.register_buffer("pos", torch.arange(offset, offset + l))
        self.register_buffer("inv_freq", 1.0 / (100.0 ** (torch.arange(0, e, 2).float() / e)), persistent=False)
        causal = torch.ones(l, l, dtype=torch.bool).tril()
        m = torch.zeros(l, l).masked_fill(~causal, -1e4)
        self.register_buffer("m", m if mask == "buffer2" else m[None, None])

    def _heads(self, t, h):
        b, l, _ = t.shape
        return t.view(b, l, h, self.e).transpose(1, 2)

    def _rotate(self, t, cos, sin):
        half = t.shape[-1] // 2
        return t * cos + torch.cat((-t[..., half:], t[..., :half]), dim=-1) * sin

    def forward(self, x):
        b, l, _ = x.shape
        q, k, v = self._heads(self.q(x), self.hq), self._heads(self.k(x), self.hk), self._heads(self.v(x), self.hk)
        if self.rotary:
            freqs = self.pos.float()[:, None] * self.inv_freq[None, :]
            emb = torch.cat((freqs, freqs), dim=-1)
            cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
            q, k = self._rotate(q, cos, sin), self._rotate(k, cos, sin)
        g = self.hq // self.hk
        if self.form == "expand" and g > 1:
            k = k[:, :, None].expand(b, self.hk, g, l, self.e).reshape(b, self.hq, l, self.e)
            v = v[:, :, None].expand(b, self.hk, g, l, self.e).reshape(b, self.hq, l, self.e)
        elif self.form == "repeat" and g > 1:
            k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
        mask = None
        if self.mask in ("buffer2", "buffer4"):
            mask = self.m.to(q.dtype)
        elif self.mask == "positions":
            mask = torch.where(self.pos[None, :] <= self.pos[:, None], 0.0, -1e4).to(q.dtype)[None, None]
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.mask == "causal",
                                           enable_gqa=self.form == "flag" and g > 1)
        return self.o(o.transpose(1, 2).reshape(b, l, self.hq * self.e))


class _State(nn.Module):
    """A buffer a model updates in place (and, for a cache, the positions it writes)."""

    def __init__(self, shape, pos=None):
        super().__init__()
        self.register_buffer("buf", torch.randn(shape))
        if pos is not None:
            self.register_buffer("pos", pos)


class _Builder:
    def __init__(self, rng: random.Random):
        self.rng = rng
        self.shapes: list[tuple] = []
        self.steps: list = []
        self.mods: list = []

    def mod(self, m: nn.Module) -> int:
        self.mods.append(m)
        return len(self.mods) - 1

    def step(self, op, ins, extra, shape):
        self.steps.append((op, tuple(ins), extra))
        self.shapes.append(tuple(shape))

    def pick(self, pred=lambda s: True):
        cands = [i for i, s in enumerate(self.shapes) if pred(s)]
        return self.rng.choice(cands) if cands else None

    def same(self, i):
        cands = [j for j, s in enumerate(self.shapes) if s == self.shapes[i] and j != i]
        return self.rng.choice(cands) if cands else None

    # ---- one random layer on a value ---------------------------------------------------
    def grow(self):
        i = self.pick()
        s = self.shapes[i]
        r = self.rng
        if len(s) == 4:
            choice = r.choice(["conv", "conv", "bn", "act", "pool", "add", "cat", "split", "param_mul", "flatten"])
            return getattr(self, f"img_{choice}")(i, s)
        choice = r.choice(["linear", "linear", "siblings", "ln", "act", "softmax", "add", "cat", "split",
                           "transpose", "attention", "param_mul", "mul_input", "state",
                           "rmsnorm", "swiglu", "sdpa", "sdpa"])
        return getattr(self, f"seq_{choice}")(i, s)

    def img_conv(self, i, s):
        c, k = self.rng.choice([4, 8]), self.rng.choice([1, 3])
        groups = self.rng.choice([1, 1, s[1]]) if c % s[1] == 0 else 1
        m = nn.Conv2d(s[1], c, k, padding=k // 2, bias=self.rng.random() < 0.5, groups=groups)
        self.step("mod", [i], self.mod(m), (s[0], c, s[2], s[3]))

    def img_bn(self, i, s):
        bn = nn.BatchNorm2d(s[1])
        with torch.no_grad():
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.5, 0.5)
        self.step("mod", [i], self.mod(bn), s)

    def img_act(self, i, s):
        self.step("act", [i], self.rng.choice(["relu", "tanh", "sigmoid", "gelu"]), s)

    def img_pool(self, i, s):
        if s[2] % 2 or s[3] % 2 or s[2] < 4:
            return self.img_act(i, s)
        self.step("pool", [i], self.rng.choice(["max", "avg"]), (s[0], s[1], s[2] // 2, s[3] // 2))

    def img_add(self, i, s):
        j = self.same(i)
        j = self.pick(lambda t: t == (s[1], 1, 1)) if j is None else j
        if j is None:
            return self.img_conv(i, s)
        self.step("add", [i, j], None, s)

    def img_cat(self, i, s):
        j = self.pick(lambda t: len(t) == 4 and t[0] == s[0] and t[2:] == s[2:])
        self.step("cat", [i, j], 1, (s[0], s[1] + self.shapes[j][1], s[2], s[3]))

    def img_split(self, i, s):
        if s[1] % 2:
            return self.img_act(i, s)
        self.step("split", [i], (1, self.rng.randrange(2)), (s[0], s[1] // 2, s[2], s[3]))

    def img_param_mul(self, i, s):
        p = nn.Linear(1, 1, bias=False)
        p.weight = nn.Parameter(torch.rand(s[1], 1, 1) + 0.5)
        self.step("param_mul", [i], self.mod(p), s)

    def img_flatten(self, i, s):
        self.step("flatten", [i], None, (s[0], s[2] * s[3], s[1]))

    def seq_linear(self, i, s):
        d = self.rng.choice([4, 8, 12])
        self.step("mod", [i], self.mod(nn.Linear(s[-1], d, bias=self.rng.random() < 0.7)), s[:-1] + (d,))

    def seq_siblings(self, i, s):
        self.seq_linear(i, s)
        d = self.rng.choice([4, 8])
        self.step("mod", [i], self.mod(nn.Linear(s[-1], d, bias=self.rng.random() < 0.7)), s[:-1] + (d,))

    def seq_ln(self, i, s):
        ln = nn.LayerNorm(s[-1], eps=self.rng.choice([1e-5, 1e-6, 3e-5]))
        with torch.no_grad():
            ln.weight.uniform_(0.5, 1.5)
            ln.bias.uniform_(-0.5, 0.5)
        self.step("mod", [i], self.mod(ln), s)

    def seq_act(self, i, s):
        self.step("act", [i], self.rng.choice(["relu", "tanh", "sigmoid", "gelu", "gelu_tanh", "gelu_tanh_written",
                                               "silu"]), s)

    def seq_rmsnorm(self, i, s):
        self.step("mod", [i], self.mod(_RMSNorm(s[-1], self.rng.choice([1e-5, 1e-6]))), s)

    def seq_swiglu(self, i, s):
        f = self.rng.choice([8, 12, 16])
        self.step("mod", [i], self.mod(_SwiGLU(s[-1], f, self.rng.random() < 0.3)), s)

    def seq_sdpa(self, i, s):
        if len(s) != 3:
            return self.seq_rmsnorm(i, s)
        r = self.rng
        hk = r.choice([1, 2])
        hq = hk * r.choice([1, 2, 4])
        e = r.choice([2, 4])
        m = _Attention(s[-1], s[1], hq, hk, e, r.choice(["expand", "repeat", "flag"]), r.random() < 0.5,
                       r.choice(["none", "causal", "buffer2", "buffer4", "positions"]), r.random() < 0.3,
                       r.choice([0, 0, 5]))
        self.step("mod", [i], self.mod(m), s)

    def seq_softmax(self, i, s):
        self.step("softmax", [i], None, s)

    def seq_add(self, i, s):
        j = self.same(i)
        j = self.pick(lambda t: len(t) < len(s) and t == s[len(s) - len(t):]) if j is None else j
        if j is None:
            return self.seq_linear(i, s)
        self.step("add", [i, j], None, s)

    def seq_mul_input(self, i, s):
        j = self.pick(lambda t: len(t) == 1 and t[0] == s[-1])
        if j is None:
            return self.seq_act(i, s)
        self.step("mul", [i, j], None, s)

    def seq_cat(self, i, s):
        j = self.pick(lambda t: len(t) == len(s) and t[:-1] == s[:-1])
        self.step("cat", [i, j], len(s) - 1, s[:-1] + (s[-1] + self.shapes[j][-1],))

    def seq_split(self, i, s):
        if s[-1] % 2:
            return self.seq_linear(i, s)
        self.step("split", [i], (len(s) - 1, self.rng.randrange(2)), s[:-1] + (s[-1] // 2,))

    def seq_transpose(self, i, s):
        if len(s) < 2:
            return self.seq_act(i, s)
        self.step("transpose2", [i], False, s[:-2] + (s[-1], s[-2]))

    def seq_attention(self, i, s):
        if len(s) < 2:
            return self.seq_linear(i, s)
        d = self.rng.choice([4, 8])
        mods = tuple(self.mod(nn.Linear(s[-1], d, bias=self.rng.random() < 0.5)) for _ in range(3))
        self.step("attention", [i], mods, s[:-1] + (d,))

    def seq_state(self, i, s):
        if self.rng.random() < 0.5 or len(s) < 2:
            return self.step("average", [i], self.mod(_State(s)), s)
        rows = s[-2] + self.rng.choice([1, 3])
        pos = torch.tensor(sorted(self.rng.sample(range(rows), s[-2])), dtype=torch.int64)
        self.step("cache", [i], self.mod(_State(s[:-2] + (rows, s[-1]), pos)), s)

    def seq_param_mul(self, i, s):
        p = nn.Linear(1, 1, bias=False)
        p.weight = nn.Parameter(torch.rand(s[-1]) + 0.5)
        self.step("param_mul", [i], self.mod(p), s)


def _inputs(rng: random.Random) -> list[tuple]:
    kind = rng.choice(["image", "sequence", "matrix"])
    if kind == "image":
        first = (1, rng.choice([2, 3, 4]), rng.choice([4, 6, 8]), rng.choice([4, 8]))
    elif kind == "sequence":
        first = (rng.choice([1, 2]), rng.choice([3, 5]), rng.choice([4, 8]))
    else:
        first = (rng.choice([2, 4]), rng.choice([4, 8]))
    shapes = [first]
    for _ in range(rng.choice([0, 0, 1, 2])):
        if rng.random() < 0.5:
            shapes.append((first[-1] if kind != "image" else first[1],) + ((1, 1) if kind == "image" else ()))
        elif kind == "image":
            shapes.append((1, rng.choice([2, 4]), first[2], first[3]))
        else:
            shapes.append(first[:-1] + (rng.choice([4, 8]),))
    return shapes


def build(seed: int, max_layers: int = 8):
    """``(module, args, kwargs)``: a random model in eval mode and its example call."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    b = _Builder(rng)
    b.shapes = _inputs(rng)
    n_in = len(b.shapes)
    for _ in range(rng.randint(1, max_layers)):
        b.grow()
    last = len(b.shapes) - 1
    outs = [last] + rng.sample(range(n_in, last), k=min(rng.choice([0, 0, 1, 2]), max(0, last - n_in)))
    out_kind = "tensor" if len(outs) == 1 and rng.random() < 0.7 else rng.choice(["tuple", "dict"])
    upcast = rng.random() < 0.1
    model = FuzzModel(b.steps, outs, out_kind, b.mods, upcast).eval()
    gen = torch.Generator().manual_seed(seed)
    xs = [torch.randn(s, generator=gen) for s in b.shapes[:n_in]]
    n_kw = rng.randrange(n_in) if n_in > 1 else 0  # trailing inputs given by keyword
    args = tuple(xs[:n_in - n_kw])
    kwargs = {f"x{k}": xs[k] for k in range(n_in - n_kw, n_in)}
    if rng.random() < 0.1:  # everything by keyword, as Hugging Face models are called
        args, kwargs = (), {f"x{k}": x for k, x in enumerate(xs)}
    return model, args, kwargs
