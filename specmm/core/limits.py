"""Position schemes of stock checkpoints: what a tree forward may not do that HF's step-by-step decoding never does.

- Absolute position tables (GPT-2 `wpe`, OPT/BioGPT `embed_positions`) have a last row: a generation may not
  need a position past it, and tree nodes past a row's token budget are cut (`tree.limit_depth`) so they
  never index past it either.
- Position-dependent RoPE variants pick their frequencies from the largest position in each forward
  (`dynamic_rope_update`: longrope switches from short to long factors past
  `original_max_position_embeddings`, dynamic NTK rescales past `max_position_embeddings`). A tree forward
  reaches further than HF's one-token steps, so a generation that could cross the switching point is refused;
  below it every forward uses the same frequencies as `generate`.
- ALiBi models (Bloom, MPT, Falcon with alibi=True) build their biases from a 2-D padding mask inside HF and
  cannot take tree masks with explicit positions: refused. So are GPT-Neo's local layers, which window by cache
  index inside the model, and decoders that take no position ids (TrOCR, the decoder halves of BART, Marian and
  Pegasus): they count positions from their cache length.
- Encoder-decoder models are refused: the adapters run decoder-only LMs.
- Recurrent models (`recurrent_state`: RWKV, xLSTM, RecurrentGemma, linear-attention hybrids) carry a
  state a rejected draft cannot be cut from, so the key/value-cache target and drafters refuse them; Mamba2 and
  its hybrids have the SSM adapter (`specmm.ssm`).
"""

from __future__ import annotations

import inspect
from typing import Any

from torch import Tensor, nn

from specmm.core.tree import TreeSpec

POSITION_TABLES = ("wpe", "embed_positions", "position_embeddings")


def _text_config(model: nn.Module):
    config = model.config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def uses_alibi(model: nn.Module) -> bool:
    """True for models whose attention adds ALiBi biases (Bloom, MPT, Falcon/others with alibi=True)."""
    text = _text_config(model)
    attn = getattr(text, "attn_config", None)
    return (getattr(text, "alibi", False) is True or getattr(attn, "alibi", False) is True
            or getattr(text, "position_embedding_type", None) == "alibi" or text.model_type == "bloom")


def check_position_scheme(model: nn.Module, role: str) -> None:
    """Raise ValueError (naming `role`, e.g. 'target') for position schemes tree verification cannot run."""
    if getattr(model, "config", None) is not None and uses_alibi(model):
        raise ValueError(
            f"{role}: {type(model).__name__} uses ALiBi attention biases, which HF builds from a 2-D padding mask; "
            "specmm verifies trees through 4-D attention masks and explicit position ids, which ALiBi models "
            "cannot take. Use a RoPE or absolute-position model")
    decoder = model.get_decoder() if callable(getattr(model, "get_decoder", None)) else None
    if isinstance(decoder, nn.Module) and "position_ids" not in inspect.signature(type(decoder).forward).parameters:
        raise ValueError(
            f"{role}: {type(model).__name__} counts positions from its cache length (its decoder "
            f"{type(decoder).__name__} takes no position_ids); tree nodes and ragged rows sit at other cache "
            "indices than their positions, so they would get other positions than generate gives them. Use a "
            "model whose decoder takes position_ids (Llama, Qwen, GPT-2, ...)")
    if "local" in (getattr(getattr(model, "config", None), "attention_layers", None) or []):
        raise ValueError(
            f"{role}: {type(model).__name__} has local attention layers (GPT-Neo), whose window the model applies "
            "itself by cache index (its `bias` buffer), not through the attention mask; tree nodes and ragged rows "
            "sit at cache indices other than their positions, so their windows would be wrong. Use a model whose "
            "sliding windows come from the mask (Mistral, Gemma 2/3, Qwen2) or one with global layers only")


# layer kinds whose state is a running summary, not one key/value entry per token (transformers' names across 5.x)
RECURRENT_LAYER_TYPES = frozenset({"linear_attention", "recurrent", "mamba", "mamba2", "rwkv", "deltanet"})


def recurrent_state(model: nn.Module) -> str | None:
    """Why the model carries a state that a rejected draft cannot be cut from, or None for a key/value-cache model.

    transformers has marked such models in several ways across 5.x (a class flag `_is_stateful` until 5.24, a
    `state`/`cache_params` argument, layer types such as 'linear_attention', no default DynamicCache), so every
    sign is read and the first found is named."""
    cls = type(model)
    if getattr(cls, "_is_stateful", False):
        return "transformers marks it stateful"
    parameters = inspect.signature(cls.forward).parameters
    for name in ("state", "cache_params"):
        if name in parameters:
            return f"its forward takes `{name}`"
    supports_dynamic_cache = getattr(cls, "_supports_default_dynamic_cache", None)
    if callable(supports_dynamic_cache) and not supports_dynamic_cache():
        return "transformers gives it a cache of its own, not a key/value DynamicCache"
    config = getattr(model, "config", None)
    if config is None:
        return None
    text = _text_config(model)
    kinds = set(getattr(text, "layer_types", None) or []) | set(getattr(text, "layers_block_type", None) or [])
    recurrent = sorted(kinds & RECURRENT_LAYER_TYPES)
    return f"its layer types include {recurrent}" if recurrent else None


def check_decoder_cache(model: nn.Module, role: str) -> None:
    """Raise ValueError (naming `role`) unless the model is a decoder-only LM whose key/value cache the adapters
    can address: an encoder-decoder model decodes from encoder states they never make, and a recurrent state
    cannot be rolled back to a row's accepted prefix (its outputs would be silently wrong, not an error)."""
    config = getattr(model, "config", None)
    if getattr(config, "is_encoder_decoder", False):
        raise ValueError(
            f"{role}: {type(model).__name__} is an encoder-decoder model; specmm speculates for decoder-only "
            "language models (a *ForCausalLM, or a vision-language model's decoder)")
    evidence = recurrent_state(model)
    if evidence:
        raise ValueError(
            f"{role}: {type(model).__name__} keeps a recurrent state ({evidence}), which "
            "specmm's key/value-cache adapters cannot roll back to the accepted tokens after a rejected draft. "
            "As a target, Mamba2 and its hybrids go through the SSM adapter (specmm.ssm.SUPPORTED_MODELS); as a "
            "drafter, use an attention model")


def position_limit(model: nn.Module) -> int | None:
    """Rows of the model's absolute position-embedding table (positions 0..limit-1), None when it has none."""
    if getattr(model, "config", None) is None:
        return None
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model  # not a VLM's vision tower
    for name, module in decoder.named_modules():
        if isinstance(module, nn.Embedding) and name.rsplit(".", 1)[-1] in POSITION_TABLES:
            return module.num_embeddings - int(getattr(module, "offset", 0))  # OPT/BioGPT shift positions by 2
    return None


def switching_ropes(model: nn.Module) -> list[tuple[str, int]]:
    """[(rope type, threshold)]: RoPE variants whose frequencies change once a forward's largest position + 1
    exceeds the threshold (HF's `dynamic_rope_update`)."""
    if getattr(model, "config", None) is None:
        return []
    text = _text_config(model)
    params = getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None) or {}
    if not isinstance(params, dict):
        return []
    groups = list(params.values()) if params and all(isinstance(v, dict) for v in params.values()) else [params]
    found = []
    for group in groups:
        kind = group.get("rope_type", group.get("type", "default")) or "default"
        if kind == "longrope":
            threshold = group.get("original_max_position_embeddings") or getattr(
                text, "original_max_position_embeddings", None) or text.max_position_embeddings
            found.append((kind, int(threshold)))
        elif "dynamic" in kind:
            found.append((kind, int(text.max_position_embeddings)))
    return found


def shared_rope_threshold(target_model: Any, draft_model: Any) -> int | None:
    """The lowest switching-RoPE threshold (`switching_ropes`) of the target when the drafter runs the same rotary
    module (e.g. the target drafting for itself), else None. A draft forward past the threshold would switch that
    module's frequencies for the target's next forward too (HF's dynamic RoPE keeps them at exactly the threshold),
    so the drafter's positions are clamped below it: nodes there lie past every row's budget anyway."""
    if not isinstance(target_model, nn.Module) or not isinstance(draft_model, nn.Module):
        return None
    thresholds = [threshold for _, threshold in switching_ropes(target_model)]
    if not thresholds:
        return None
    ropes = {id(m) for m in target_model.modules() if hasattr(m, "original_inv_freq")}
    if any(id(m) in ropes for m in draft_model.modules()):
        return min(thresholds)
    return None


def tuned_query_slot(model: nn.Module) -> int | None:
    """Llama 4's NoPE layers scale their queries by log1p(floor((slot + 1) / floor_scale)) (`attn_temperature_tuning`,
    the slot counted from the cache's length, not from position ids): 1 until slot floor_scale - 1, which this
    returns (None for models without it)."""
    if getattr(model, "config", None) is None:
        return None
    text = _text_config(model)
    nope = 0 in (getattr(text, "no_rope_layers", None) or [])  # 1: the layer uses RoPE, 0: NoPE
    if not (nope and getattr(text, "attn_temperature_tuning", False)):
        return None
    return int(text.floor_scale) - 1


def check_generation_positions(model: Any, attention_mask: Tensor, max_new_tokens: int,
                               cache_slots: int | None = None) -> None:
    """Raise ValueError, before any forward, when a generation would need positions the model cannot give
    exactly: past an absolute position table, across a position-dependent RoPE switch, or (given `cache_slots`,
    the most slots a generation's caches hold) into the slots where Llama 4 starts to scale its NoPE queries.

    attention_mask: [B, L] of the prompt. The largest position any forward runs is longest + max_new_tokens - 2
    (the last new token is never run), both for `generate` and for specmm's budget-cut trees.
    """
    if not isinstance(model, nn.Module):
        return
    longest = int(attention_mask.sum(1).max())
    needed = longest + max_new_tokens - 1  # positions 0..needed-1
    name = type(model).__name__
    limit = position_limit(model)
    if limit is not None and needed > limit:
        raise ValueError(
            f"max_new_tokens: {name} has absolute position embeddings for {limit} positions; the longest prompt "
            f"row ({longest} tokens) plus {max_new_tokens} new tokens needs {needed}. Use max_new_tokens <= "
            f"{limit + 1 - longest} or a shorter prompt")
    for kind, threshold in switching_ropes(model):
        if needed > threshold:
            raise ValueError(
                f"max_new_tokens: {name} uses {kind!r} RoPE, whose frequencies switch once a forward reaches "
                f"position {threshold} (HF picks them from the largest position in each forward, and tree forwards "
                f"reach further than step-by-step decoding), so tokens past it could differ from generate. The "
                f"longest prompt row ({longest} tokens) plus {max_new_tokens} new tokens needs {needed} positions; "
                f"use max_new_tokens <= {threshold + 1 - longest}")
    tuned = tuned_query_slot(model)
    if tuned is not None and cache_slots is not None and cache_slots > tuned:
        raise ValueError(
            f"max_new_tokens: {name} scales the queries of its NoPE layers by their cache slot from slot {tuned} on "
            f"(attn_temperature_tuning), counting slots as generate fills its cache; specmm's caches also hold a "
            f"tree round (and left padding), so past that slot tokens could differ from generate. The prompt "
            f"({attention_mask.shape[1]} slots) plus {max_new_tokens} new tokens and a round need up to "
            f"{cache_slots} slots: use a shorter generation (or a config with attn_temperature_tuning=False)")


def check_tree_vocab(spec: TreeSpec, vocab_size: int) -> None:
    """Raise ValueError when a tree asks for more sibling candidates than the vocabulary has."""
    if spec.kind == "dynamic" and spec.top_k >= vocab_size:
        raise ValueError(f"tree: top_k={spec.top_k} must be smaller than the vocabulary ({vocab_size} tokens)")
    if spec.kind == "static" and spec.top_k > vocab_size:
        raise ValueError(f"tree: static choice rank {spec.top_k - 1} must be smaller than the vocabulary "
                         f"({vocab_size} tokens)")
