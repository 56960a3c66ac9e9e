"""LlamaGen GPT (upstream `autoregressive/models/gpt.py` layout and key names), written for slot caches.

Decoder-only Llama blocks over [condition tokens ; image tokens] with 2-D RoPE: condition positions have a
zero rotary table (their q and k vanish, as upstream), image token j rotates by (row, col) of grid cell j.
Every forward takes explicit rotary rows, cache slots and a boolean mask, so trees and ragged rows need
nothing special.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specmm.core.inplace import move_slots_, write_slots_
from specmm.image_ar.llamagen.config import GPTConfig


def rope_table_2d(grid_size: int, head_dim: int, base: float = 10000, cls_token_num: int = 1) -> Tensor:
    """[cls + grid^2, head_dim // 2, 2] (cos, sin) rows; zero rows for the condition positions."""
    half = head_dim // 2
    freqs = 1.0 / (base ** (torch.arange(0, half, 2)[: half // 2].float() / half))  # [hd/4]
    angles = torch.outer(torch.arange(grid_size).float(), freqs)  # [G, hd/4]
    grid = torch.cat([angles[:, None, :].expand(-1, grid_size, -1),  # row angle, first half
                      angles[None, :, :].expand(grid_size, -1, -1)], dim=-1)  # column angle, second half
    table = torch.stack([grid.cos(), grid.sin()], dim=-1).flatten(0, 1)  # [G*G, hd/2, 2]
    return torch.cat([torch.zeros(cls_token_num, half, 2), table])


def apply_rope(x: Tensor, rope: Tensor) -> Tensor:
    """x [R, n, H, D], rope [R, n, D/2, 2] -> x rotated in adjacent pairs (GPT-J style), in float32."""
    pairs = x.float().reshape(*x.shape[:-1], -1, 2)  # [R, n, H, D/2, 2]
    cos, sin = rope[:, :, None, :, 0], rope[:, :, None, :, 1]
    out = torch.stack([pairs[..., 0] * cos - pairs[..., 1] * sin, pairs[..., 1] * cos + pairs[..., 0] * sin], -1)
    return out.flatten(3).type_as(x)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class KVCache:
    """Static per-layer key/value buffers [R, H_kv, S, D]; a forward writes its tokens at given slots."""

    def __init__(self, layers: int, rows: int, heads: int, length: int, head_dim: int, dtype, device):
        shape = (rows, heads, length, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]

    @property
    def length(self) -> int:
        return self.keys[0].shape[2]

    def write(self, layer: int, slots: Tensor, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """Store keys/values [R, H, n, D] at slots [R, n]; return the layer's full buffers."""
        write_slots_(self.keys[layer], slots, keys)  # in place even when compiled (core/inplace.py)
        write_slots_(self.values[layer], slots, values)
        return self.keys[layer], self.values[layer]

    def move(self, source: Tensor, dest: Tensor) -> None:
        """Copy slots source [R, m] to dest [R, m] in every layer (gathered first, so overlaps are safe)."""
        for buffers in (self.keys, self.values):
            for states in buffers:
                move_slots_(states, source, dest)

    def select_rows(self, rows: Tensor) -> None:
        self.keys = [k[rows] for k in self.keys]
        self.values = [v[rows] for v in self.values]


class Attention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head, self.kv_heads, self.head_dim = config.n_head, config.kv_heads, config.head_dim
        self.wqkv = nn.Linear(config.dim, (config.n_head + 2 * config.kv_heads) * config.head_dim, bias=False)
        self.wo = nn.Linear(config.dim, config.dim, bias=False)

    def forward(self, x: Tensor, rope: Tensor, mask: Tensor | None, cache: KVCache | None = None,
                layer: int = 0, slots: Tensor | None = None) -> Tensor:
        rows, n, dim = x.shape
        kv = self.kv_heads * self.head_dim
        q, k, v = self.wqkv(x).split([dim, kv, kv], dim=-1)
        q = apply_rope(q.view(rows, n, self.n_head, self.head_dim), rope).transpose(1, 2)  # [R, H, n, D]
        k = apply_rope(k.view(rows, n, self.kv_heads, self.head_dim), rope).transpose(1, 2)
        v = v.view(rows, n, self.kv_heads, self.head_dim).transpose(1, 2)
        if cache is not None:
            k, v = cache.write(layer, slots, k, v)  # [R, H_kv, S, D]
        if self.kv_heads != self.n_head:
            k = k.repeat_interleave(self.n_head // self.kv_heads, dim=1)
            v = v.repeat_interleave(self.n_head // self.kv_heads, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        return self.wo(out.transpose(1, 2).reshape(rows, n, dim))


class FeedForward(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.w1 = nn.Linear(config.dim, config.ffn_dim, bias=False)
        self.w3 = nn.Linear(config.dim, config.ffn_dim, bias=False)
        self.w2 = nn.Linear(config.ffn_dim, config.dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.attention = Attention(config)
        self.feed_forward = FeedForward(config)
        self.attention_norm = RMSNorm(config.dim, config.norm_eps)
        self.ffn_norm = RMSNorm(config.dim, config.norm_eps)

    def forward(self, x: Tensor, rope: Tensor, mask: Tensor | None, cache: KVCache | None = None, layer: int = 0,
                slots: Tensor | None = None) -> Tensor:
        h = x + self.attention(self.attention_norm(x), rope, mask, cache, layer, slots)
        return h + self.feed_forward(self.ffn_norm(h))


class LabelEmbedder(nn.Module):
    """Class id -> one condition token; row `num_classes` is the null class used for guidance."""

    def __init__(self, num_classes: int, dim: int, with_null: bool):
        super().__init__()
        self.embedding_table = nn.Embedding(num_classes + int(with_null), dim)

    def forward(self, labels: Tensor) -> Tensor:
        return self.embedding_table(labels)[:, None]  # [B, 1, d]


class CaptionMLP(nn.Module):
    def __init__(self, in_features: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden, bias=False)
        self.fc2 = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class CaptionEmbedder(nn.Module):
    """Caption embeddings [B, T, caption_dim] -> condition tokens; `uncond_embedding` is the null caption."""

    def __init__(self, caption_dim: int, dim: int, token_num: int):
        super().__init__()
        self.cap_proj = CaptionMLP(caption_dim, dim)
        self.register_buffer("uncond_embedding", torch.randn(token_num, caption_dim) / caption_dim ** 0.5)

    def forward(self, captions: Tensor) -> Tensor:
        return self.cap_proj(captions)


class LlamaGenGPT(nn.Module):
    """The LlamaGen transformer; `state_dict()` keys equal upstream's, so released checkpoints load directly."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        if config.model_type == "c2i":
            self.cls_embedding = LabelEmbedder(config.num_classes, config.dim, config.has_null_class)
        else:
            self.cls_embedding = CaptionEmbedder(config.caption_dim, config.dim, config.cls_token_num)
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(TransformerBlock(config) for _ in range(config.n_layer))
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.output = nn.Linear(config.dim, config.vocab_size, bias=False)
        self.register_buffer("rope", rope_table_2d(config.grid_size, config.head_dim, config.rope_base,
                                                   config.cls_token_num), persistent=False)

    def condition_embeddings(self, conditions: Tensor) -> Tensor:
        """Class ids [B] or captions [B, T, caption_dim] -> condition tokens [B, cls_token_num, d]."""
        return self.cls_embedding(conditions)[:, : self.config.cls_token_num]

    def null_conditions(self, conditions: Tensor) -> Tensor:
        """The unconditional counterpart of `conditions` (null class id, or the learned null caption)."""
        if self.config.model_type == "c2i":
            return torch.full_like(conditions, self.config.num_classes)
        return torch.zeros_like(conditions) + self.cls_embedding.uncond_embedding.to(conditions.dtype)

    def hidden(self, embeds: Tensor, rope: Tensor, mask: Tensor | None, cache: KVCache | None = None,
               slots: Tensor | None = None) -> Tensor:
        """Run the blocks on embeds [R, n, d]; returns the final-norm features [R, n, d]."""
        h = embeds
        for i, layer in enumerate(self.layers):
            h = layer(h, rope, mask, cache, i, slots)
        return self.norm(h)

    def logits(self, features: Tensor) -> Tensor:
        return self.output(features).float()

    def forward(self, conditions: Tensor, tokens: Tensor, return_features: bool = False):
        """Teacher forcing: logits [B, N, V] for image tokens [B, N] (position i predicts token i), causal."""
        embeds = torch.cat([self.condition_embeddings(conditions), self.tok_embeddings(tokens[:, :-1])], 1)
        rope = self.rope[: embeds.shape[1]].expand(embeds.shape[0], -1, -1, -1)
        features = self.hidden(embeds, rope, None)[:, self.config.cls_token_num - 1:]  # [B, N, d]
        logits = self.logits(features)
        return (logits, features) if return_features else logits

    def new_cache(self, rows: int, length: int) -> KVCache:
        c, ref = self.config, self.tok_embeddings.weight
        return KVCache(c.n_layer, rows, c.kv_heads, length, c.head_dim, ref.dtype, ref.device)
