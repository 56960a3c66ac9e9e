"""Adapters that give any mask predictor the decoder's interface: `mask_id` and `logits(x, mask)` [B, L, V].

Row i of `logits` always predicts the token at position i: the Dream adapter applies Dream's shift
(the prediction for position i comes from hidden state i - 1) so decoders never see it. Upstream folders
load as they come, without remote code: LLaDA (`model_type` "llada") into `MaskedDiffusionLM`, Dream
(`model_type` "Dream", Qwen2 parameter layout) into a stock `Qwen2ForCausalLM` behind `DreamAdapter`.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import torch
from torch import Tensor, nn

from specmm.diffusion_lm.model import CONFIG_NAME, LLaDAConfig, MaskedDiffusionLM, _positions

# DreamConfig fields that are not Qwen2Config fields, or that describe the file rather than the model
_DREAM_ONLY = ("model_type", "architectures", "auto_map", "torch_dtype", "dtype", "transformers_version",
               "attention_bias", "mlp_bias")


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
        extra = {}
        if "position_ids" in inspect.signature(self.model.forward).parameters:  # left padding: count real tokens
            extra["position_ids"] = _positions(attention_mask, input_ids)
        return self.model(input_ids=input_ids, attention_mask=mask, **extra).logits


class WithMaskId:
    """A mask predictor seen with another mask id, leaving the model (and its config) as it was."""

    def __init__(self, model, mask_id: int):
        self._model, self.mask_id = model, int(mask_id)

    def __getattr__(self, name: str):
        return getattr(self._model, name)

    def __call__(self, *args, **kwargs):
        return self._model(*args, **kwargs)


def load_folder(folder: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
    """An upstream LLaDA or Dream checkpoint folder (config.json + safetensors, as published) as a stock model."""
    folder = Path(folder)
    if not (folder / CONFIG_NAME).is_file():
        raise ValueError(f"model: {folder} has no {CONFIG_NAME} (expected a LLaDA or Dream checkpoint folder)")
    raw = json.loads((folder / CONFIG_NAME).read_text())
    kind = str(raw.get("model_type", "")).lower()
    if kind == "llada":
        return MaskedDiffusionLM.from_pretrained(folder, dtype=dtype, device=device)
    if kind == "dream":
        return _load_dream(folder, raw, dtype, device)
    raise ValueError(f"model: {folder} has model_type {raw.get('model_type')!r}; expected an upstream LLaDA "
                     "('llada') or Dream ('Dream') folder")


def _load_dream(folder: Path, raw: dict, dtype: torch.dtype, device) -> nn.Module:
    """Dream's weights use Qwen2's names (model.layers.*, lm_head): a stock Qwen2ForCausalLM holds them."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if raw.get("use_mrope"):
        raise ValueError(f"model: {folder} uses M-RoPE, which Dream's Qwen2 layout does not have")
    config = Qwen2Config(**{k: v for k, v in raw.items() if k not in _DREAM_ONLY})
    model, info = Qwen2ForCausalLM.from_pretrained(folder, config=config, dtype=dtype, attn_implementation="sdpa",
                                                   output_loading_info=True)
    problems = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    if problems:
        raise ValueError(f"model: {folder} is not in Dream's (Qwen2) parameter layout: {problems}")
    return model.to(device).eval()


def _llada_from_remote_code(model: nn.Module) -> MaskedDiffusionLM:
    """A hub `LLaDAModelLM` (loaded with trust_remote_code) as MaskedDiffusionLM sharing its weights: the
    layouts match, and MaskedDiffusionLM honours attention masks (the hub code ignores them)."""
    config = model.config.to_dict() if hasattr(model.config, "to_dict") else vars(model.config)
    native = MaskedDiffusionLM(LLaDAConfig.from_dict(config))
    missing, unexpected = native.load_state_dict(model.state_dict(), strict=False, assign=True)
    if missing or unexpected:
        raise ValueError(f"model: {type(model).__name__} is not in LLaDA's layout; missing {missing[:4]}, "
                         f"unexpected {unexpected[:4]}")
    return native.eval()


def as_diffusion_lm(model, mask_id: int | None = None, *, dtype: torch.dtype = torch.float32,
                    device: str | torch.device = "cpu"):
    """`model` as a decoder-ready mask predictor; `mask_id` overrides the model's own.

    `model` may be a folder path (an upstream LLaDA or Dream checkpoint as published, loaded in `dtype` on
    `device`), a MaskedDiffusionLM, a Dream model (a stock Qwen2 causal LM or the hub's DreamModel: `model_type`
    "Dream" in any case), the hub's LLaDAModelLM, a HF *ForMaskedLM, or an object with mask_id and logits().
    """
    if isinstance(model, (str, Path)):
        model = load_folder(model, dtype=dtype, device=device)
    config = getattr(model, "config", None)
    model_type = str(getattr(config, "model_type", "") or "").lower()
    if isinstance(model, nn.Module) and not isinstance(model, MaskedDiffusionLM) and model_type == "llada":
        model = _llada_from_remote_code(model)
    if isinstance(model, MaskedDiffusionLM):
        if mask_id is not None and mask_id != model.mask_id:
            return WithMaskId(model, mask_id)  # the caller's model keeps its own
        if model.mask_id is None:
            raise ValueError("mask_id: the model's config has no mask_token_id; pass mask_id")
        return model
    if hasattr(model, "logits") and hasattr(model, "mask_id") and not isinstance(model, nn.Module):
        if model.mask_id is None:
            raise ValueError("mask_id: the model has no mask id; pass mask_id")
        return model
    if config is not None and model_type in ("qwen2", "dream"):
        mask_id = mask_id if mask_id is not None else getattr(config, "mask_token_id", None)
        if mask_id is None:
            raise ValueError("mask_id: a Dream model needs a mask id (Dream's is 151666); pass mask_id")
        return DreamAdapter(model, mask_id)
    if config is not None and type(model).__name__.endswith("ForMaskedLM"):
        return MaskedLMAdapter(model, mask_id)
    raise ValueError(f"model: unsupported {type(model).__name__}; use a LLaDA or Dream folder, MaskedDiffusionLM, a "
                     "Qwen2-layout (Dream) causal LM, a HF *ForMaskedLM, or an object with mask_id and "
                     "logits(input_ids, attention_mask)")
