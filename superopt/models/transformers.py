"""BERT-base encoder and ViT-B/16, with attention written out op by op.

Attention is explicit (Linear q/k/v, reshape/permute into heads, matmul, divide by
sqrt(head_dim), softmax, matmul, permute/reshape back, Linear out) rather than
nn.MultiheadAttention or F.scaled_dot_product_attention, so torch.export yields plain
aten linear/matmul/softmax/view/permute ops that a rewriter can see. q, k and v are
three Linears (not one fused 3x projection) to avoid a split; the parameter count is
the same either way. GELU is the exact (erf) form.
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["SelfAttention", "BertEncoder", "VisionTransformer", "bert_base", "vit_b16"]


class SelfAttention(nn.Module):
    """Multi-head scaled dot-product self-attention with output projection, no mask."""

    def __init__(self, hidden: int, heads: int, dropout: float = 0.0):
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden size {hidden} is not a multiple of {heads} heads")
        self.heads, self.head_dim = heads, hidden // heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(hidden, hidden)

    def _split(self, t: torch.Tensor) -> torch.Tensor:
        b, n, _ = t.shape
        return t.reshape(b, n, self.heads, self.head_dim).permute(0, 2, 1, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self._split(self.query(x)), self._split(self.key(x)), self._split(self.value(x))
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        probs = self.dropout(torch.softmax(scores, dim=-1))
        ctx = torch.matmul(probs, v).permute(0, 2, 1, 3).reshape(b, n, d)
        return self.out(ctx)


class BertLayer(nn.Module):
    """Post-LN block: LN(x + attn(x)), then LN(h + W2 GELU(W1 h))."""

    def __init__(self, hidden: int, heads: int, ffn: int, dropout: float = 0.1, eps: float = 1e-12):
        super().__init__()
        self.attention = SelfAttention(hidden, heads, dropout)
        self.attn_dropout = nn.Dropout(dropout)
        self.attn_norm = nn.LayerNorm(hidden, eps=eps)
        self.intermediate = nn.Linear(hidden, ffn)
        self.act = nn.GELU()
        self.output = nn.Linear(ffn, hidden)
        self.out_dropout = nn.Dropout(dropout)
        self.out_norm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.attn_norm(x + self.attn_dropout(self.attention(x)))
        return self.out_norm(x + self.out_dropout(self.output(self.act(self.intermediate(x)))))


class BertEncoder(nn.Module):
    """The BERT encoder stack alone: hidden states [batch, seq, hidden] in and out
    (no embeddings, no pooler, no attention mask)."""

    def __init__(self, num_layers: int = 12, hidden: int = 768, heads: int = 12, ffn: int = 3072):
        super().__init__()
        self.layers = nn.ModuleList(BertLayer(hidden, heads, ffn) for _ in range(num_layers))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            hidden_states = layer(hidden_states)
        return hidden_states


class VitBlock(nn.Module):
    """Pre-LN block: x + attn(LN(x)), then x + W2 GELU(W1 LN(x))."""

    def __init__(self, hidden: int, heads: int, mlp: int, eps: float = 1e-6):
        super().__init__()
        self.ln_1 = nn.LayerNorm(hidden, eps=eps)
        self.attention = SelfAttention(hidden, heads)
        self.dropout = nn.Dropout(0.0)
        self.ln_2 = nn.LayerNorm(hidden, eps=eps)
        self.mlp = nn.Sequential(
            nn.Linear(hidden, mlp), nn.GELU(), nn.Dropout(0.0), nn.Linear(mlp, hidden), nn.Dropout(0.0)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.dropout(self.attention(self.ln_1(x)))
        return x + self.mlp(self.ln_2(x))


class VisionTransformer(nn.Module):
    """ViT: conv patch embedding, class token, learned position embedding, pre-LN
    encoder, final LN, linear head on the class token."""

    def __init__(self, image_size: int = 224, patch: int = 16, num_layers: int = 12, hidden: int = 768,
                 heads: int = 12, mlp: int = 3072, num_classes: int = 1000):  # fmt: skip
        super().__init__()
        if image_size % patch:
            raise ValueError(f"image size {image_size} is not a multiple of patch size {patch}")
        tokens = (image_size // patch) ** 2 + 1
        self.conv_proj = nn.Conv2d(3, hidden, patch, stride=patch)
        self.class_token = nn.Parameter(torch.randn(1, 1, hidden) * 0.02)
        self.pos_embedding = nn.Parameter(torch.randn(1, tokens, hidden) * 0.02)
        self.dropout = nn.Dropout(0.0)
        self.layers = nn.Sequential(*(VitBlock(hidden, heads, mlp) for _ in range(num_layers)))
        self.ln = nn.LayerNorm(hidden, eps=1e-6)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.conv_proj(images).flatten(2).transpose(1, 2)  # [b, patches, hidden]
        x = torch.cat([self.class_token.expand(x.shape[0], -1, -1), x], 1)
        x = self.layers(self.dropout(x + self.pos_embedding))
        return self.head(self.ln(x)[:, 0])


def bert_base(num_layers: int = 12) -> BertEncoder:
    """BERT-base encoder: 12 layers, hidden 768, 12 heads, FFN 3072, post-LN (eps 1e-12)."""
    return BertEncoder(num_layers=num_layers)


def vit_b16(num_classes: int = 1000, num_layers: int = 12) -> VisionTransformer:
    """ViT-B/16 at 224x224: 196 patches + class token, 12 layers, hidden 768, MLP 3072."""
    return VisionTransformer(num_layers=num_layers, num_classes=num_classes)
