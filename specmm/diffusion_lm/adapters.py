"""Adapters that give any mask predictor the decoder's interface: `mask_id` and `logits(x, mask)` [B, L, V].

Row i of `logits` always predicts the token at position i: the Dream adapter applies Dream's shift
(the prediction for position i comes from hidden state i - 1) so decoders never see it.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from specmm.diffusion_lm.model import MaskedDiffusionLM, _positions


class DreamAdapter:
    """A Qwen2-layout causal LM run bidirectionally (a full 4-D mask) with logits shifted by one, as Dream."""

    supports_cache = False

    def __init__(self, model: nn.Module, mask_id: int):
        if not hasattr(model, "get_output_embeddings"):
            raise ValueError(f"model: {type(model).__name__} is not a HF causal LM")
        self.model, self.mask_id = model, int(mask_id)

    def logits(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        b, n = input_ids.shape
        keys = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        full = keys[:, None, None, :].expand(b, 1, n, n)  # [B, 1, L, L] bidirectional, padded keys masked
        raw = self.model(input_ids=input_ids, attention_mask=full, position_ids=_positions(attention_mask, input_ids),
                         use_cache=False).logits  # [B, L, V]
        return torch.cat((raw[:, :1], raw[:, :-1]), dim=1)  # Dream's shift: position i <- hidden i - 1


class MaskedLMAdapter:
    """Any HF masked-LM predictor (BertForMaskedLM, ModernBertForMaskedLM, ...): logits align already."""

    supports_cache = False

    def __init__(self, model: nn.Module, mask_id: int | None = None):
        mask_id = mask_id if mask_id is not None else getattr(getattr(model, "config", None), "mask_token_id", None)
        if mask_id is None:
            raise ValueError("mask_id: the model's config has no mask_token_id; pass mask_id")
        self.model, self.mask_id = model, int(mask_id)

    def logits(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        return self.model(input_ids=input_ids, attention_mask=mask).logits


def as_diffusion_lm(model, mask_id: int | None = None):
    """`model` as a decoder-ready mask predictor; `mask_id` overrides the model's own."""
    if isinstance(model, MaskedDiffusionLM):
        if mask_id is not None and mask_id != model.mask_id:
            model.config.mask_token_id = int(mask_id)
        if model.mask_id is None:
            raise ValueError("mask_id: the model's config has no mask_token_id; pass mask_id")
        return model
    if hasattr(model, "logits") and hasattr(model, "mask_id") and not isinstance(model, nn.Module):
        if model.mask_id is None:
            raise ValueError("mask_id: the model has no mask id; pass mask_id")
        return model
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "model_type", None) in ("qwen2", "dream"):
        mask_id = mask_id if mask_id is not None else getattr(config, "mask_token_id", None)
        if mask_id is None:
            raise ValueError("mask_id: a Dream model needs a mask id (Dream's is 151666); pass mask_id")
        return DreamAdapter(model, mask_id)
    if config is not None and type(model).__name__.endswith("ForMaskedLM"):
        return MaskedLMAdapter(model, mask_id)
    raise ValueError(f"model: unsupported {type(model).__name__}; use MaskedDiffusionLM, a Qwen2-layout (Dream) "
                     "causal LM, a HF *ForMaskedLM, or an object with mask_id and logits(input_ids, attention_mask)")
