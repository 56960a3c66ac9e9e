"""VisionDrafter: one feature-level drafter class for the VLM methods (eagle | msd | vispec | dream | flash).

It is the core `EagleDrafter` loop (tree drafting, accepted-path feedback, row selection) with a VLM prefill:
slot t pairs the target feature f_t with the merged input embedding of token t+1 (the EAGLE shift), and each
visual span's slots go through the method's compressor. A span is a run of image tokens, or of video tokens (a
whole Qwen2-VL, Qwen2.5-VL or LLaVA-OneVision video; one Qwen3-VL frame group, which timestamps separate).
Slots keep their real positions, so a compressed span leaves a gap and the position counter runs apart from the
drafter cache length (ViSpec). Methods differ only in the head (heads.py) and the compressor (compressors.py).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import Tensor, nn
from transformers import LlamaConfig

from specmm.core.eagle import EagleDrafter, checkpoint_config, head_config_for, read_checkpoint, target_module
from specmm.core.target import FEATURES, INPUTS_EMBEDS, ModelRunner, PrefillOutput, output_vocab_size
from specmm.core.tree import TreeSpec
from specmm.vlm.heads import METHODS, DreamHead, VisionHead
from specmm.vlm.targets import IMAGE_ATTENTION, IMAGE_MASK

logger = logging.getLogger(__name__)

METHOD_DEFAULTS = {"vispec": {"num_q": 2}, "flash": {"num_latents": 64, "sar_steps": 3},
                   "dream": {"keep_ratio": 0.75}}


class VisionDrafter(EagleDrafter):
    """Feature-level drafter for VLM targets; `method` picks the head and the visual-token compressor."""

    needs = frozenset({FEATURES, INPUTS_EMBEDS})

    def __init__(self, head: VisionHead | DreamHead, target_model: nn.Module):
        _check_fits(head.config, target_model)
        super().__init__(head, target_model)
        self.method = head.method
        self.layout = f"specmm-{self.method}"
        if getattr(head.compressor, "needs_scores", False):
            self.needs = self.needs | {IMAGE_ATTENTION}
        self.visual_tokens_seen = 0  # visual (image and video) slots the drafter ran last time
        self.image_tokens = 0  # visual (image and video) tokens of the last prompts

    # ---- construction and checkpoints -------------------------------------------------------------------
    @classmethod
    def for_target(cls, target, method: str = "vispec", **overrides) -> VisionDrafter:
        """A freshly initialised drafter of `method` sized for `target` (an HF VLM or a specmm target)."""
        if method not in METHODS:
            raise ValueError(f"method: expected one of {', '.join(METHODS)}, got {method!r}")
        model = target_module(target)
        fields = {**METHOD_DEFAULTS.get(method, {}), **overrides}
        return cls._build(model, head_config_for(model, specmm_method=method, **fields))

    @classmethod
    def from_pretrained(cls, path: str | Path, target) -> VisionDrafter:
        """Load specmm's format or an upstream EAGLE-1/2 / ViSpec / DREAM checkpoint folder."""
        raw, state = read_checkpoint(path)
        method = raw.get("specmm_method") or _method_from_keys(state)
        config = checkpoint_config({**METHOD_DEFAULTS.get(method, {}), **raw, "specmm_method": method})
        return cls._build(target_module(target), config, state)

    @classmethod
    def _new_head(cls, config: LlamaConfig) -> VisionHead | DreamHead:
        return DreamHead(config) if config.specmm_method == "dream" else VisionHead(config)

    @classmethod
    def _check_config(cls, config: LlamaConfig, model: nn.Module) -> None:
        _check_fits(config, model)

    def check_spec(self, spec: TreeSpec) -> None:
        if self.method == "flash" and spec.depth > self.head.config.sar_steps + 1:
            raise ValueError(f"tree: the flash head proposes {self.head.config.sar_steps + 1} levels per forward; "
                             f"got a tree of depth {spec.depth}")

    # ---- inputs -----------------------------------------------------------------------------------------
    def _inputs(self, token_embeds: Tensor, features: Tensor, global_vectors: Tensor | None = None) -> dict:
        if self.method == "dream":
            return {"inputs_embeds": token_embeds, "cross_states": features}
        if global_vectors is None and self.method == "vispec":
            global_vectors = self.global_vector[:, None, :].expand_as(features)
        return {"inputs_embeds": self.head.fuse(token_embeds, features, global_vectors)}

    def select_rows(self, rows: Tensor) -> None:
        super().select_rows(rows)
        self.global_vector = self.global_vector[rows]

    def start(self, input_ids: Tensor, attention_mask: Tensor, prefill: PrefillOutput) -> None:
        self.runner = ModelRunner(self.head, input_ids.shape[0], static=self.static_plan)
        self.draft_forwards = 0
        inputs, valid, positions, global_vector, stats = self.prefill_inputs(input_ids, attention_mask, prefill)
        self.global_vector = global_vector
        self.visual_tokens_seen, self.image_tokens = stats
        self.next_position = positions.new_zeros(input_ids.shape[0])
        self._start_pending(inputs, valid, positions)

    def prefill_inputs(self, input_ids: Tensor, attention_mask: Tensor, prefill: PrefillOutput):
        """The drafter's prompt slots: (inputs {name: [B, L-1, H]}, valid [B, L-1], positions [B, L-1],
        global vector [B, H], (image slots kept, image tokens)). Slot t pairs f_t with token t+1."""
        batch, length = input_ids.shape
        hidden = self.head.config.hidden_size
        dtype, device = self.lm_head.weight.dtype, input_ids.device
        global_vector = torch.zeros(batch, hidden, dtype=dtype, device=device)
        valid = attention_mask.bool()
        if length == 1:
            features = torch.zeros(batch, 1, hidden, dtype=dtype, device=device)
            positions = torch.zeros_like(input_ids)
            inputs = self._inputs(self.embed_tokens(input_ids), features, torch.zeros_like(features))
            return inputs, valid, positions, global_vector, (0, 0)
        if prefill.features is None or prefill.inputs_embeds is None:
            raise ValueError("target: the VisionDrafter needs the target's prefill features and input embeddings")
        features = prefill.features.clone()  # [B, L-1, H]
        embeds = torch.cat([prefill.inputs_embeds[:, 1:], self.embed_tokens(input_ids[:, -1:])], 1)  # token t+1
        image_mask = prefill.extras.get(IMAGE_MASK)
        image_mask = torch.zeros_like(valid[:, :-1]) if image_mask is None else image_mask.bool()
        image_pairs = torch.cat([image_mask[:, 1:], image_mask.new_zeros(batch, 1)], 1)  # [B, L-1]
        scores = prefill.extras.get(IMAGE_ATTENTION)
        scores = torch.cat([scores[:, 1:], scores.new_zeros(batch, 1)], 1) if scores is not None else None

        pairs = valid[:, 1:] & valid[:, :-1]
        lone = ~pairs.any(1)  # a one-token prompt: pair (0, x_0)
        features[lone, -1] = 0
        pairs[lone, -1] = True
        positions = (pairs.long().cumsum(1) - 1).clamp_min(0)  # real positions: dropped image slots leave gaps
        kept = pairs.clone()
        fused_at, direct_at, global_at = [], [], []  # (row, slots, values) replacements, applied out of place
        seen = images = 0
        for row in range(batch):
            for start, end in _runs(image_pairs[row] & pairs[row]):
                span = slice(start, end)
                image = self.head.compressor(embeds[row, span], None if scores is None else scores[row, span])
                slots = start + image.slots
                kept[row, span] = False
                kept[row, slots] = True
                images += end - start
                seen += len(slots)
                (fused_at if image.fused else direct_at).append((row, slots, image.tokens))
                if image.global_vector is not None:
                    following = torch.arange(end, length - 1, device=device)
                    global_at.append((row, following, image.global_vector.expand(len(following), -1)))
                    global_vector = _put(global_vector, [(row, None, image.global_vector)])
        embeds = _put(embeds, fused_at)
        if self.method == "dream":
            inputs = self._inputs(embeds, features)
        else:
            slot_globals = _put(torch.zeros_like(features), global_at) if self.method == "vispec" else None
            inputs = {"inputs_embeds": _put(self.head.fuse(embeds, features, slot_globals), direct_at)}
        return inputs, kept, positions, global_vector, (seen, images)

    def teacher_forced(self, input_ids: Tensor, attention_mask: Tensor, prefill: PrefillOutput):
        """Run the head over a whole prompt in one forward without a cache (training, fixtures).

        Returns (output with last_hidden_state [B, L-1, H] zeroed at dropped slots, kept [B, L-1]).
        """
        inputs, kept, positions, _, _ = self.prefill_inputs(input_ids, attention_mask, prefill)
        out = self.head(**inputs, attention_mask=kept.long(), position_ids=positions)
        out.last_hidden_state = out.last_hidden_state * kept[..., None]
        return out, kept

    # ---- FLASH: levels 2..K+1 from the semi-autoregressive projection, no extra forwards -------------------
    def _expander(self, expand, root_hidden: Tensor):
        if self.method != "flash":
            return expand
        levels = self.lm_head(self.head.sar(root_hidden[:, None])[:, 0])  # [B, K, V] logits for depths 2..K+1
        call = {"depth": 1}

        def from_levels(tokens: Tensor, parent_slots: Tensor) -> Tensor:
            call["depth"] += 1  # tree builders expand one depth per call, root children first
            return levels[:, call["depth"] - 2, None, :].expand(*tokens.shape, -1)

        return from_levels


def _check_fits(config: LlamaConfig, target_model: nn.Module) -> None:
    """A drafter must share the target's hidden size (it reads its features) and vocabulary (its LM head)."""
    text = target_model.config.get_text_config()
    if config.hidden_size != text.hidden_size:
        raise ValueError(f"drafter: hidden_size {config.hidden_size} does not fit the target's "
                         f"hidden_size {text.hidden_size}")
    vocab = output_vocab_size(target_model)
    if getattr(config, "vocab_size", vocab) != vocab:
        raise ValueError(f"drafter: vocabulary size {config.vocab_size} does not fit the target's {vocab}")


def _put(values: Tensor, replacements: list[tuple[int, Tensor | None, Tensor]]) -> Tensor:
    """Out-of-place writes (autograd-safe): values[row, slots] = new for each (row, slots, new);
    slots None writes values[row] itself."""
    if not replacements:
        return values
    if replacements[0][1] is None:
        rows = torch.tensor([r for r, _, _ in replacements], device=values.device)
        return values.index_put((rows,), torch.stack([v for _, _, v in replacements]))
    rows = torch.cat([torch.full_like(s, r) for r, s, _ in replacements])
    slots = torch.cat([s for _, s, _ in replacements])
    return values.index_put((rows, slots), torch.cat([v for _, _, v in replacements]))


def _runs(mask: Tensor) -> list[tuple[int, int]]:
    """[n] bool -> [(start, end)] of its runs of True."""
    padded = torch.cat([mask.new_zeros(1), mask, mask.new_zeros(1)]).to(torch.int8)
    edges = (padded[1:] - padded[:-1]).nonzero().flatten().tolist()
    return list(zip(edges[::2], edges[1::2]))


def _method_from_keys(state: dict[str, Tensor]) -> str:
    """Upstream checkpoints carry no method name: ViSpec has `imadpt.*`, DREAM a cross-attention layer."""
    if any(k.startswith("imadpt.") for k in state):
        return "vispec"
    if any(".cross_attn." in k for k in state):
        return "dream"
    if "fc.weight" in state:
        return "eagle"
    raise ValueError("checkpoint: keys match none of the EAGLE-1/2, ViSpec or DREAM layouts")


__all__ = ["METHODS", "VisionDrafter", "IMAGE_MASK", "IMAGE_ATTENTION"]
