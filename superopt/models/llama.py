"""A Llama-3-style decoder written the way Hugging Face's ``modeling_llama.py`` writes it.

RMSNorm with the float32 upcast (``hidden_states.to(torch.float32)``, ``pow(2).mean(-1)``,
``torch.rsqrt``, the cast back, the weight multiplied last); rotary embeddings applied with
``rotate_half`` (two slices, a negation, a concat) to cos/sin tables given as inputs, as
``LlamaDecoderLayer`` receives ``position_embeddings``; grouped-query attention through
``F.scaled_dot_product_attention`` over key-value heads repeated per query group, either by
HF's ``repeat_kv`` (``[:, :, None]`` + ``expand`` + ``reshape``) or by ``repeat_interleave``
(``kv_repeat``); a SwiGLU MLP; no biases. The same layer as other model families write it
(:class:`LlamaConfig`): q/k/v biases (Qwen2); fused ``qkv_proj`` / ``gate_up_proj``
projections sliced and chunked in the graph (Phi-3); Gemma's float32 ``1 + w`` RMSNorm with a
GELU-gated MLP (multi-query attention over heads of 256 at Gemma-2B's sizes); Qwen3's RMSNorm
of each query and key head before the rotary embedding, over a head dim that is not hidden //
heads (Qwen3-4B: 32 heads of 128 over hidden 2560).
:class:`LlamaWithRotary` computes the rotary tables in the graph from position ids, as
``LlamaModel`` does before its layers (``LlamaRotaryEmbedding``).

Two modes. **prefill**: ``hidden_states [b, seq, hidden]``, ``cos``/``sin [b, seq, head_dim]``,
causal attention (``is_causal``, no mask). **decode**: one new token per sequence over a static
KV cache: ``hidden_states [b, 1, hidden]``, ``cos``/``sin [b, 1, head_dim]``, an additive
``attention_mask [b, 1, 1, cache]`` (0 where a cached position may be seen, the float32 minimum
elsewhere, as HF builds it), ``cache_position [1]`` (int64) and, per layer, the key and value
caches ``[b, kv_heads, cache, head_dim]``. The new token's key and value are written at
``cache_position`` with ``index_copy_`` into the caches, in place, as HF's ``StaticCache.update``
does (``cache="inplace"``, the default; the program returns the hidden states and updates its
cache inputs), or with ``index_copy`` out of place, the updated caches returned after the hidden
states (``cache="copy"``: every step then writes whole new caches), or in place into caches the
model holds as buffers (``cache="buffers"``, :class:`CachesInBuffers`: gpt-fast's and
transformers' ``executorch`` export's way; the step takes no cache inputs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["LlamaConfig", "LlamaDecoder", "LlamaWithRotary", "CachesInBuffers", "MaskFromPositions", "LLAMA3_8B", "LLAMA32_1B", "LLAMA_TINY", "QWEN2_1P5B",
           "PHI3_MINI", "GEMMA_2B", "QWEN3_4B", "QWEN2_TINY", "PHI3_TINY", "GEMMA_TINY", "QWEN3_TINY", "rotary_tables", "rotate_half", "repeat_kv", "linear_params"]


@dataclass(frozen=True)
class LlamaConfig:
    """Sizes of a Llama-style decoder."""

    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    eps: float = 1e-5
    rope_theta: float = 500000.0
    #: biases on the q, k and v projections (Qwen2's ``attention_bias``; o_proj has none)
    qkv_bias: bool = False
    #: one ``qkv_proj`` sliced into q, k, v and one ``gate_up_proj`` chunked into gate and up,
    #: as Phi-3's modeling code writes them (``Phi3Attention``, ``Phi3MLP``)
    fused: bool = False
    #: Gemma's layer: RMSNorm all in float32 with the weight as ``1 + w`` (``GemmaRMSNorm``)
    #: and a GELU-gated MLP (``gelu_pytorch_tanh``) in place of SwiGLU
    gemma: bool = False
    #: the head dim where it is not hidden // heads (Qwen3-4B: 32 heads of 128 over hidden 2560;
    #: 0: hidden // heads)
    head_dim: int = 0
    #: Qwen3's per-head RMSNorm of the queries and keys before the rotary embedding
    #: (``q_norm``, ``k_norm`` over the head dim)
    qk_norm: bool = False

    @property
    def head_size(self) -> int:
        """The head dim: ``head_dim`` where given, else hidden // heads."""
        return self.head_dim or self.hidden // self.heads


#: Llama-3-8B's layer sizes (config.json of meta-llama/Meta-Llama-3-8B)
LLAMA3_8B = LlamaConfig(hidden=4096, heads=32, kv_heads=8, ffn=14336)
#: Llama-3.2-1B's layer sizes (config.json of meta-llama/Llama-3.2-1B): head dim 64, not 128
LLAMA32_1B = LlamaConfig(hidden=2048, heads=32, kv_heads=8, ffn=8192)
#: the same architecture, small enough for CPU tests in seconds
LLAMA_TINY = LlamaConfig(hidden=64, heads=4, kv_heads=2, ffn=96)
#: Qwen2-1.5B's layer sizes (config.json of Qwen/Qwen2-1.5B): q/k/v biases, 12 q / 2 kv heads
QWEN2_1P5B = LlamaConfig(hidden=1536, heads=12, kv_heads=2, ffn=8960, eps=1e-6, rope_theta=1000000.0,
                         qkv_bias=True)
#: Phi-3-mini's layer sizes (config.json of microsoft/Phi-3-mini-4k-instruct): fused projections,
#: 32 heads of 96 (not a power of two), no grouping
PHI3_MINI = LlamaConfig(hidden=3072, heads=32, kv_heads=32, ffn=8192, rope_theta=10000.0, fused=True)
#: Gemma-2B's layer sizes (config.json of google/gemma-2b): 8 query heads of 256 over one
#: key-value head (multi-query), FFN 16384
GEMMA_2B = LlamaConfig(hidden=2048, heads=8, kv_heads=1, ffn=16384, eps=1e-6, rope_theta=10000.0, gemma=True)
#: Qwen3-4B's layer sizes (config.json of Qwen/Qwen3-4B): per-head q/k RMSNorm, 32 q / 8 kv heads
#: of 128 over hidden 2560 (the attention is 4096 wide: the head dim is not hidden // heads)
QWEN3_4B = LlamaConfig(hidden=2560, heads=32, kv_heads=8, ffn=9728, eps=1e-6, rope_theta=1000000.0,
                       head_dim=128, qk_norm=True)
#: small versions of the four, for CPU tests (head dims 16, 24, 32 and 32 over hidden 64)
QWEN2_TINY = LlamaConfig(hidden=64, heads=4, kv_heads=2, ffn=96, eps=1e-6, rope_theta=1000000.0, qkv_bias=True)
PHI3_TINY = LlamaConfig(hidden=96, heads=4, kv_heads=4, ffn=128, rope_theta=10000.0, fused=True)
GEMMA_TINY = LlamaConfig(hidden=64, heads=2, kv_heads=1, ffn=128, eps=1e-6, rope_theta=10000.0, gemma=True)
QWEN3_TINY = LlamaConfig(hidden=64, heads=4, kv_heads=2, ffn=96, eps=1e-6, rope_theta=1000000.0, head_dim=32,
                         qk_norm=True)


def linear_params(cfg: LlamaConfig) -> int:
    """Weights of the linear layers of one layer (q, k, v, o, gate, up, down; q/k/v biases)."""
    head_dim = cfg.head_size
    qkv = (cfg.heads + 2 * cfg.kv_heads) * head_dim
    return cfg.hidden * (qkv + cfg.heads * head_dim) + 3 * cfg.hidden * cfg.ffn + (qkv if cfg.qkv_bias else 0)


class LlamaRMSNorm(nn.Module):
    """HF's LlamaRMSNorm: computed in float32 whatever the input dtype."""

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class GemmaRMSNorm(nn.Module):
    """HF's GemmaRMSNorm: all in float32, the weight applied as ``1 + w`` (zeros: the identity),
    cast back last."""

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(hidden_size))
        self.eps = eps

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        output = self._norm(x.float())
        output = output * (1.0 + self.weight.float())
        return output.type_as(x)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Rotates half the hidden dims of the input (HF's helper)."""
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim: int = 1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed


def repeat_kv(hidden_states: torch.Tensor, n_rep: int) -> torch.Tensor:
    """HF's repeat_kv: [b, kv_heads, s, d] -> [b, kv_heads * n_rep, s, d], each head n_rep times."""
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


def rotary_tables(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [b, len, head_dim] for integer ``positions [b, len]`` (LlamaRotaryEmbedding
    without rope scaling)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    freqs = positions.float()[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


class LlamaRotaryEmbedding(nn.Module):
    """HF's LlamaRotaryEmbedding (default rope type): cos and sin [b, len, head_dim] computed
    in the graph from integer ``position_ids [b, len]`` (HF's autocast guard is left out:
    everything here is float32 already)."""

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.attention_scaling = 1.0

    def forward(self, x, position_ids):
        inv_freq_expanded = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
        position_ids_expanded = position_ids[:, None, :].float()
        freqs = (inv_freq_expanded.float() @ position_ids_expanded.float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos() * self.attention_scaling
        sin = emb.sin() * self.attention_scaling
        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


class LlamaWithRotary(nn.Module):
    """A :class:`LlamaDecoder` fed as ``LlamaModel`` feeds its layers: the rotary tables computed
    from ``position_ids [b, len]`` (int64) in the graph, the other inputs as the decoder's."""

    def __init__(self, decoder: "LlamaDecoder"):
        super().__init__()
        cfg = decoder.cfg
        self.decoder, self.mode = decoder, decoder.mode
        self.layers = decoder.layers
        self.rotary_emb = LlamaRotaryEmbedding(cfg.head_size, cfg.rope_theta)

    def forward(self, hidden_states, position_ids, attention_mask=None, cache_position=None, *caches):
        cos, sin = self.rotary_emb(hidden_states, position_ids)
        return self.decoder(hidden_states, cos, sin, attention_mask, cache_position, *caches)


class MaskFromPositions(nn.Module):
    """A decode step (:class:`LlamaDecoder` or :class:`LlamaWithRotary`) that builds its attention
    mask in the graph from the cache position, as transformers' decode export does (a boolean
    ``key index <= position`` over the cache, handed to attention as it is) instead of taking the
    additive mask as an input: called as the step is, without ``attention_mask``."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner, self.mode, self.layers = inner, inner.mode, inner.layers

    def forward(self, hidden_states, *args):
        n = 1 if isinstance(self.inner, LlamaWithRotary) else 2  # position ids, or the cos and sin tables
        rotary, cache_position, caches = args[:n], args[n], args[n + 1:]
        keys = torch.arange(caches[0].shape[2], device=cache_position.device)
        mask = keys[None, None, None, :] <= cache_position[None, None, :, None]
        return self.inner(hidden_states, *rotary, mask, cache_position, *caches)


class CachesInBuffers(nn.Module):
    """A decode step (:class:`LlamaDecoder` or :class:`LlamaWithRotary`) whose key and value
    caches the model holds, as buffers updated in place (``caches.k0``, ``caches.v0``, ...), as
    gpt-fast and transformers' ``executorch`` export keep them: called with the step's inputs
    only. :meth:`keep` sets the caches (the example inputs' own)."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner, self.mode, self.layers = inner, inner.mode, inner.layers
        self.caches = nn.Module()

    def keep(self, caches) -> None:
        if len(caches) != 2 * len(self.layers):
            raise ValueError(f"a key and a value cache per layer: {2 * len(self.layers)}, got {len(caches)}")
        for i, c in enumerate(caches):
            self.caches.register_buffer(f"{'kv'[i % 2]}{i // 2}", c)

    def forward(self, hidden_states, *inputs):
        return self.inner(hidden_states, *inputs, *self.caches.buffers())


class LlamaAttention(nn.Module):
    def __init__(self, cfg: LlamaConfig, kv_repeat: str, cache: str = "inplace"):
        super().__init__()
        if cache not in ("inplace", "copy"):
            raise ValueError(f"cache must be 'inplace' (index_copy_, as StaticCache) or 'copy' (index_copy), got {cache!r}")
        self.cache_update = cache
        if kv_repeat not in ("expand", "repeat_interleave"):
            raise ValueError(f"kv_repeat must be 'expand' or 'repeat_interleave', got {kv_repeat!r}")
        self.head_dim = cfg.head_size
        self.num_key_value_groups = cfg.heads // cfg.kv_heads
        self.scaling = self.head_dim ** -0.5
        self.kv_repeat = kv_repeat
        self.q_size, self.kv_size = cfg.heads * self.head_dim, cfg.kv_heads * self.head_dim
        if cfg.fused:  # Phi3Attention: one projection, sliced
            self.qkv_proj = nn.Linear(cfg.hidden, self.q_size + 2 * self.kv_size, bias=cfg.qkv_bias)
        else:
            self.q_proj = nn.Linear(cfg.hidden, self.q_size, bias=cfg.qkv_bias)
            self.k_proj = nn.Linear(cfg.hidden, self.kv_size, bias=cfg.qkv_bias)
            self.v_proj = nn.Linear(cfg.hidden, self.kv_size, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.heads * self.head_dim, cfg.hidden, bias=False)
        if cfg.qk_norm:  # Qwen3Attention: RMSNorm over each head's dim, before the rotary embedding
            self.q_norm = LlamaRMSNorm(self.head_dim, eps=cfg.eps)
            self.k_norm = LlamaRMSNorm(self.head_dim, eps=cfg.eps)

    def _repeat(self, t: torch.Tensor) -> torch.Tensor:
        if self.kv_repeat == "expand":
            return repeat_kv(t, self.num_key_value_groups)
        return t.repeat_interleave(self.num_key_value_groups, dim=1)

    def forward(self, hidden_states, cos, sin, attention_mask=None, cache=None):
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        if hasattr(self, "qkv_proj"):
            qkv = self.qkv_proj(hidden_states)
            query_states = qkv[..., :self.q_size]
            key_states = qkv[..., self.q_size:self.q_size + self.kv_size]
            value_states = qkv[..., self.q_size + self.kv_size:]
        else:
            query_states = self.q_proj(hidden_states)
            key_states = self.k_proj(hidden_states)
            value_states = self.v_proj(hidden_states)
        query_states, key_states = query_states.view(hidden_shape), key_states.view(hidden_shape)
        if hasattr(self, "q_norm"):
            query_states, key_states = self.q_norm(query_states), self.k_norm(key_states)
        query_states = query_states.transpose(1, 2)
        key_states = key_states.transpose(1, 2)
        value_states = value_states.view(hidden_shape).transpose(1, 2)
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)
        if cache is not None:  # (k_cache, v_cache, cache_position): StaticCache.update
            k_cache, v_cache, cache_position = cache
            if self.cache_update == "inplace":
                key_states = k_cache.index_copy_(2, cache_position, key_states)
                value_states = v_cache.index_copy_(2, cache_position, value_states)
                cache = ()
            else:
                key_states = k_cache.index_copy(2, cache_position, key_states)
                value_states = v_cache.index_copy(2, cache_position, value_states)
                cache = (key_states, value_states)
        key, value = self._repeat(key_states), self._repeat(value_states)
        causal_mask = attention_mask[:, :, :, : key.shape[-2]] if attention_mask is not None else None
        is_causal = query_states.shape[2] > 1 and causal_mask is None
        attn_output = F.scaled_dot_product_attention(query_states, key, value, attn_mask=causal_mask, dropout_p=0.0,
                                                     scale=self.scaling, is_causal=is_causal)
        attn_output = attn_output.transpose(1, 2).contiguous()
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        return self.o_proj(attn_output), cache


class LlamaMLP(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        if cfg.fused:  # Phi3MLP: one projection, chunked
            self.gate_up_proj = nn.Linear(cfg.hidden, 2 * cfg.ffn, bias=False)
        else:
            self.gate_proj = nn.Linear(cfg.hidden, cfg.ffn, bias=False)
            self.up_proj = nn.Linear(cfg.hidden, cfg.ffn, bias=False)
        self.down_proj = nn.Linear(cfg.ffn, cfg.hidden, bias=False)
        self.act_fn = nn.GELU(approximate="tanh") if cfg.gemma else nn.SiLU()

    def forward(self, x):
        if hasattr(self, "gate_up_proj"):
            gate, up_states = self.gate_up_proj(x).chunk(2, dim=-1)
            return self.down_proj(up_states * self.act_fn(gate))
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig, kv_repeat: str, cache: str = "inplace"):
        super().__init__()
        self.self_attn = LlamaAttention(cfg, kv_repeat, cache)
        self.mlp = LlamaMLP(cfg)
        norm = GemmaRMSNorm if cfg.gemma else LlamaRMSNorm
        self.input_layernorm = norm(cfg.hidden, eps=cfg.eps)
        self.post_attention_layernorm = norm(cfg.hidden, eps=cfg.eps)

    def forward(self, hidden_states, cos, sin, attention_mask=None, cache=None):
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states, cache = self.self_attn(hidden_states, cos, sin, attention_mask, cache)
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        return residual + hidden_states, cache


class LlamaDecoder(nn.Module):
    """``num_layers`` decoder layers (no embedding, no final norm or head): prefill or one
    decode step (see the module docstring for the inputs)."""

    def __init__(self, cfg: LlamaConfig = LLAMA3_8B, num_layers: int = 1, mode: str = "prefill",
                 kv_repeat: str = "expand", cache: str = "inplace"):
        super().__init__()
        if mode not in ("prefill", "decode"):
            raise ValueError(f"mode must be 'prefill' or 'decode', got {mode!r}")
        if (not cfg.head_dim and cfg.hidden % cfg.heads) or cfg.heads % cfg.kv_heads:
            raise ValueError(f"hidden {cfg.hidden}, {cfg.heads} heads, {cfg.kv_heads} kv heads do not divide")
        self.cfg, self.mode = cfg, mode
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg, kv_repeat, cache) for _ in range(num_layers))
        with torch.no_grad():  # random norm weights: a rewrite that drops one must show
            for m in self.modules():
                if isinstance(m, LlamaRMSNorm):
                    m.weight.uniform_(0.5, 1.5)
                elif isinstance(m, GemmaRMSNorm):
                    m.weight.uniform_(-0.5, 0.5)
                elif isinstance(m, nn.Linear):
                    m.weight.normal_(0.0, 1.0 / math.sqrt(m.in_features))
                    if m.bias is not None:
                        m.bias.normal_(0.0, 0.1)

    def forward(self, hidden_states, cos, sin, attention_mask=None, cache_position=None, *caches):
        if self.mode == "decode" and len(caches) != 2 * len(self.layers):
            raise ValueError(f"decode takes a key and a value cache per layer: {2 * len(self.layers)}, "
                             f"got {len(caches)}")
        updated = []
        for i, layer in enumerate(self.layers):
            cache = (caches[2 * i], caches[2 * i + 1], cache_position) if self.mode == "decode" else None
            hidden_states, cache = layer(hidden_states, cos, sin, attention_mask, cache)
            updated.extend(cache or ())
        return (hidden_states, *updated) if updated else hidden_states


def example_inputs(cfg: LlamaConfig, mode: str, batch_size: int, seq_len: int, cache_len: int,
                   num_layers: int, generator: torch.Generator | None = None,
                   positions: bool = False) -> tuple[torch.Tensor, ...]:
    """Inputs of one call: prefill of ``seq_len`` tokens from position 0, or the decode step at
    position ``cache_len // 2`` (the cache filled before it, zero after, as a static cache is).
    ``positions``: position ids [b, len] in place of the cos and sin tables (:class:`LlamaWithRotary`)."""
    head_dim = cfg.head_size

    def rotary(pos):
        return (pos.contiguous(),) if positions else rotary_tables(pos, head_dim, cfg.rope_theta)
    if mode == "prefill":
        pos = torch.arange(seq_len).expand(batch_size, seq_len)
        return (torch.randn(batch_size, seq_len, cfg.hidden, generator=generator), *rotary(pos))
    p = cache_len // 2
    tables = rotary(torch.full((batch_size, 1), p))
    mask = torch.zeros(batch_size, 1, 1, cache_len)
    mask[..., p + 1:] = torch.finfo(torch.float32).min
    caches = []
    for _ in range(2 * num_layers):
        c = torch.randn(batch_size, cfg.kv_heads, cache_len, head_dim, generator=generator)
        c[:, :, p:] = 0.0
        caches.append(c)
    hidden = torch.randn(batch_size, 1, cfg.hidden, generator=generator)
    return (hidden, *tables, mask, torch.tensor([p], dtype=torch.int64), *caches)
