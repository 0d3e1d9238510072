"""A GPT-2 block written the way Hugging Face's ``modeling_gpt2.py`` writes it.

``Conv1D`` layers (``torch.addmm`` of a flattened view with an [in, out] weight); one fused
``c_attn`` projection whose output is ``split`` into q, k and v; causal attention through
``F.scaled_dot_product_attention`` (``is_causal``, as HF's sdpa path calls it without a mask);
pre-LN with biases; the MLP's activation either ``gelu_new`` written out
(``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))``) or
``F.gelu(approximate="tanh")`` (HF's ``gelu_pytorch_tanh``), chosen by ``gelu``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["GPT2Config", "GPT2Block", "GPT2_SMALL", "GPT2_TINY", "gpt2_params"]


@dataclass(frozen=True)
class GPT2Config:
    """Sizes of a GPT-2 block."""

    hidden: int
    heads: int
    inner: int
    eps: float = 1e-5


#: GPT-2 (124M)'s block: n_embd 768, n_head 12, n_inner 4 x 768
GPT2_SMALL = GPT2Config(hidden=768, heads=12, inner=3072)
#: the same architecture, small enough for CPU tests in seconds
GPT2_TINY = GPT2Config(hidden=64, heads=4, inner=256)


def gpt2_params(cfg: GPT2Config) -> int:
    """Parameters of one block: c_attn, c_proj, c_fc, the MLP's c_proj (weights and biases), two
    layer norms."""
    h, f = cfg.hidden, cfg.inner
    return (h * 3 * h + 3 * h) + (h * h + h) + (h * f + f) + (f * h + h) + 4 * h


class Conv1D(nn.Module):
    """HF's Conv1D: a linear layer with the weight stored transposed ([in, out])."""

    def __init__(self, nf: int, nx: int):
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.randn(nx, nf) / math.sqrt(nx))
        self.bias = nn.Parameter(torch.randn(nf) * 0.02)

    def forward(self, x):
        size_out = x.size()[:-1] + (self.nf,)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return x.view(size_out)


class NewGELUActivation(nn.Module):
    """HF's gelu_new, written out (the tanh approximation of GELU used by GPT-2)."""

    def forward(self, input):
        return 0.5 * input * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (input + 0.044715 * torch.pow(input, 3.0))))


class PytorchGELUTanh(nn.Module):
    """HF's gelu_pytorch_tanh."""

    def forward(self, input):
        return F.gelu(input, approximate="tanh")


class GPT2Attention(nn.Module):
    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.embed_dim, self.num_heads = cfg.hidden, cfg.heads
        self.head_dim = cfg.hidden // cfg.heads
        self.split_size = cfg.hidden
        self.c_attn = Conv1D(3 * cfg.hidden, cfg.hidden)
        self.c_proj = Conv1D(cfg.hidden, cfg.hidden)

    def forward(self, hidden_states):
        input_shape = hidden_states.shape[:-1]
        query_states, key_states, value_states = self.c_attn(hidden_states).split(self.split_size, dim=2)
        shape_kv = (*key_states.shape[:-1], -1, self.head_dim)
        key_states = key_states.view(shape_kv).transpose(1, 2)
        value_states = value_states.view(shape_kv).transpose(1, 2)
        shape_q = (*query_states.shape[:-1], -1, self.head_dim)
        query_states = query_states.view(shape_q).transpose(1, 2)
        attn_output = F.scaled_dot_product_attention(query_states, key_states, value_states, attn_mask=None,
                                                     dropout_p=0.0, scale=self.head_dim ** -0.5, is_causal=True)
        attn_output = attn_output.transpose(1, 2).contiguous()
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        return self.c_proj(attn_output)


class GPT2MLP(nn.Module):
    def __init__(self, cfg: GPT2Config, gelu: str):
        super().__init__()
        if gelu not in ("written", "tanh"):
            raise ValueError(f"gelu must be 'written' (gelu_new) or 'tanh' (F.gelu approximate='tanh'), got {gelu!r}")
        self.c_fc = Conv1D(cfg.inner, cfg.hidden)
        self.c_proj = Conv1D(cfg.hidden, cfg.inner)
        self.act = NewGELUActivation() if gelu == "written" else PytorchGELUTanh()

    def forward(self, hidden_states):
        return self.c_proj(self.act(self.c_fc(hidden_states)))


class GPT2Block(nn.Module):
    """One pre-LN GPT-2 block: hidden states [batch, seq, hidden] in and out (no mask, causal)."""

    def __init__(self, cfg: GPT2Config = GPT2_SMALL, gelu: str = "written"):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.hidden, eps=cfg.eps)
        self.attn = GPT2Attention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.hidden, eps=cfg.eps)
        self.mlp = GPT2MLP(cfg, gelu)

    def forward(self, hidden_states):
        residual = hidden_states
        hidden_states = residual + self.attn(self.ln_1(hidden_states))
        return hidden_states + self.mlp(self.ln_2(hidden_states))
