"""Draft heads of the VLM methods. All predict the target's next last-layer feature, decoded by the target's
frozen LM head; they differ in how a slot's token embedding and target feature enter.

- `VisionHead`: EAGLE's fc([embedding; feature]) -> one Llama layer, plus the method's compressor modules
  (ViSpec `imadpt` + `img_fc`, FLASH latent queries) and FLASH's semi-autoregressive `sar` projection.
- `DreamHead`: self-attention layer, gated cross-attention over target features, self-attention layer, norm.
Checkpoints use upstream key names (`fc`, `layers.0.*`, `imadpt.*`, `img_fc`, DREAM `layers.{0,1,2}.*`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import (
    LlamaDecoderLayer,
    LlamaMLP,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
)

from specmm.core.eagle import EagleHead
from specmm.core.target import cache_keyword
from specmm.vlm.compressors import AttentionTopK, Bypass, Identity, LatentQueryPooling, LearnedQueryPooling

METHODS = ("eagle", "msd", "vispec", "dream", "flash")


class SemiAutoregressiveProjection(nn.Module):
    """FLASH SAR head: from the head's output at a slot, the features `steps` further positions ahead
    ([B, n, H] -> [B, n, steps, H]), so one drafter forward proposes several tree levels."""

    def __init__(self, hidden_size: int, steps: int):
        super().__init__()
        self.steps = steps
        self.ar_proj = nn.Sequential(nn.Linear(hidden_size, 4 * hidden_size), nn.SiLU(),
                                     nn.Linear(4 * hidden_size, steps * hidden_size))

    def forward(self, hidden: Tensor) -> Tensor:
        return self.ar_proj(hidden).unflatten(-1, (self.steps, hidden.shape[-1]))


class VisionHead(EagleHead):
    """EAGLE head + the method's image modules; `fuse` builds a text slot's decoder input."""

    def __init__(self, config: LlamaConfig):
        super().__init__(config)
        method = config.specmm_method
        hidden = config.hidden_size
        self.method = method
        if method == "vispec":
            self.imadpt = LearnedQueryPooling(hidden, config.num_attention_heads, config.num_q,
                                              bias=bool(getattr(config, "qkv_bias", False)))
            self.img_fc = nn.Linear(2 * hidden, hidden, bias=True)
            with torch.no_grad():  # [I | 0]: starts as the plain EAGLE path (a stage-1 head is reproduced)
                self.img_fc.weight.zero_()
                self.img_fc.weight[:, :hidden].copy_(torch.eye(hidden))
                self.img_fc.bias.zero_()
        if method == "flash":
            self.latent = LatentQueryPooling(hidden, config.num_latents)
            self.sar = SemiAutoregressiveProjection(hidden, config.sar_steps)

    @property
    def compressor(self) -> nn.Module:
        """What the drafter sees of each image (the module lives under its upstream name)."""
        if self.method == "vispec":
            return self.imadpt
        if self.method == "flash":
            return self.latent
        return Bypass() if self.method == "msd" else Identity()

    def fuse(self, token_embeds: Tensor, features: Tensor, global_vectors: Tensor | None = None) -> Tensor:
        """[B, n, H] embeddings + features (+ per-slot global image vectors) -> decoder inputs [B, n, H]."""
        if self.method == "vispec":
            if global_vectors is None:
                global_vectors = torch.zeros_like(features)
            features = self.img_fc(torch.cat([features, global_vectors], dim=-1))
        return self.fc(torch.cat([token_embeds, features], dim=-1))

    def forward(self, inputs_embeds: Tensor, **kwargs):
        return self.decoder(inputs_embeds=inputs_embeds, **kwargs)


class GatedCrossAttention(nn.Module):
    """Multi-head attention of the drafter stream over target features (q/k RMSNorm, no RoPE); its keys and
    values are cached in the drafter cache like a self-attention layer's, slot for slot."""

    def __init__(self, config: LlamaConfig, layer_idx: int):
        super().__init__()
        hidden, self.heads = config.hidden_size, config.num_attention_heads
        self.head_dim = hidden // self.heads
        self.layer_idx = layer_idx
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(hidden, hidden, bias=False) for _ in range(4))
        self.q_norm = LlamaRMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = LlamaRMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def forward(self, hidden: Tensor, cross_states: Tensor, mask: Tensor, cache=None) -> Tensor:
        batch, n, _ = hidden.shape
        split = (batch, n, self.heads, self.head_dim)
        queries = self.q_norm(self.q_proj(hidden).view(split)).transpose(1, 2)  # [B, h, n, d]
        keys = self.k_norm(self.k_proj(cross_states).view(split)).transpose(1, 2)
        values = self.v_proj(cross_states).view(split).transpose(1, 2)
        if cache is not None:
            keys, values = cache.update(keys, values, self.layer_idx)
        out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask)  # [B, h, n, d]
        return self.o_proj(out.transpose(1, 2).reshape(batch, n, -1))


class GatedCrossAttentionLayer(nn.Module):
    """Flamingo/Mllama-style block: x + tanh(g_attn) * cross_attn(norm x), then x + tanh(g_mlp) * mlp(norm x);
    both gates start at 0, so the block starts as the identity."""

    def __init__(self, config: LlamaConfig, layer_idx: int):
        super().__init__()
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.cross_attn = GatedCrossAttention(config, layer_idx)
        self.cross_attn_attn_gate = nn.Parameter(torch.zeros(1))
        self.mlp = LlamaMLP(config)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.cross_attn_mlp_gate = nn.Parameter(torch.zeros(1))

    def forward(self, hidden: Tensor, cross_states: Tensor, mask: Tensor, cache=None) -> Tensor:
        attended = self.cross_attn(self.input_layernorm(hidden), cross_states, mask, cache)
        hidden = hidden + self.cross_attn_attn_gate.tanh() * attended
        return hidden + self.cross_attn_mlp_gate.tanh() * self.mlp(self.post_attention_layernorm(hidden))


@dataclass
class DreamOutput:
    last_hidden_state: Tensor  # [B, n, H] predicted next features (after the final norm)
    mid_hidden_state: Tensor  # [B, n, H] after the cross-attention layer (supervised by a mid target layer)


LAYER_CACHE_KEYWORD = cache_keyword(LlamaDecoderLayer)  # 'cache' from transformers 5.24


class DreamHead(nn.Module):
    """DREAM drafter: the stream starts from token embeddings (image rows: vision features); target features
    enter only through the gated cross-attention layer; slot t pairs feature f_t with token t+1."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        self.method = "dream"
        self.layers = nn.ModuleList([LlamaDecoderLayer(config, 0), GatedCrossAttentionLayer(config, 1),
                                     LlamaDecoderLayer(config, 2)])
        self.layers[0].input_layernorm = nn.Identity()
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = LlamaRotaryEmbedding(config)

    @property
    def compressor(self) -> nn.Module:
        ratio = getattr(self.config, "keep_ratio", 1.0)
        return Identity() if ratio >= 1.0 else AttentionTopK(ratio)

    @property
    def num_cache_layers(self) -> int:
        """Cache layers a static cache must hold: all three layers cache keys, whatever the config says."""
        return len(self.layers)

    def forward(self, inputs_embeds: Tensor, cross_states: Tensor, attention_mask: Tensor,
                position_ids: Tensor, past_key_values=None, use_cache: bool = False, **kwargs) -> DreamOutput:
        """attention_mask: [B, 1, n, S] (bool, or additive float) from the runner, or [B, n] key validity."""
        mask = attention_mask
        if mask.dim() == 2:
            n = mask.shape[1]
            causal = torch.ones(n, n, dtype=torch.bool, device=mask.device).tril()
            mask = (causal[None] & mask.bool()[:, None, :])[:, None]  # [B, 1, n, n]
            mask = mask | torch.eye(n, dtype=torch.bool, device=mask.device)  # padded rows see themselves
        cache = past_key_values if use_cache else None
        position_embeddings = self.rotary_emb(inputs_embeds, position_ids)
        common = dict(attention_mask=mask, position_ids=position_ids, position_embeddings=position_embeddings,
                      **{LAYER_CACHE_KEYWORD: cache})
        hidden = self.layers[0](inputs_embeds, **common)
        mid = self.layers[1](hidden, cross_states, mask, cache)
        hidden = self.layers[2](mid, **common)
        return DreamOutput(self.norm(hidden), mid)

    def upstream_state_dict(self) -> dict[str, Tensor]:
        return {k: v for k, v in self.state_dict().items() if not k.startswith("rotary_emb")}

    def load_upstream_state_dict(self, state: dict[str, Tensor]) -> None:
        state = {k: v for k, v in state.items() if k != "embed_tokens.weight"}
        expected = self.upstream_state_dict()
        missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
        if missing or unexpected:
            raise ValueError(f"DREAM checkpoint does not match the head layout: missing {missing}, "
                             f"unexpected {unexpected}")
        self.load_state_dict(state, strict=False)
