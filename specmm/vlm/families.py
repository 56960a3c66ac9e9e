"""Target adapters for more VLM families: Gemma 3, SmolVLM / Idefics3, LLaVA-OneVision, Qwen2-VL, Qwen3-VL and
InternVL. Each keeps the prompt prefill in the model's own forward (vision tower, projector, merge, DeepStack)
and says only what differs: its inputs, image-token counts, prompt mask and positions. Importing this module
(done by `specmm.vlm`) adds them to `targets.SUPPORTED`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from transformers import Gemma3ForConditionalGeneration
from transformers.models.gemma3.modeling_gemma3 import get_block_sequence_ids_for_mask

from specmm.vlm.targets import SUPPORTED, VLMTarget


class Gemma3Target(VLMTarget):
    """`Gemma3ForConditionalGeneration`: `mm_tokens_per_image` tokens per image; with `token_type_ids` (as the
    processor returns them) the tokens of one image attend to each other bidirectionally in the prompt, exactly
    as HF's prefill mask (causal OR same-image block, then the sliding window on local layers)."""

    model_input_names = ("pixel_values", "token_type_ids")
    token_types_name = "token_type_ids"

    def tokens_per_image(self, model_inputs: dict) -> list[int] | None:
        return [int(self.model.config.mm_tokens_per_image)] * model_inputs["pixel_values"].shape[0]

    def extend_prompt(self, valid: Tensor, positions: Tensor | None, model_inputs: dict, **inputs: Any) -> None:
        types = model_inputs.get("token_type_ids")
        if types is None:  # HF then prefills causally too
            return super().extend_prompt(valid, positions, model_inputs, **inputs)
        runner = self.runner
        if runner.cache.round_length or bool(runner.cache.lengths.any()):
            raise ValueError("Gemma 3 prompts are prefilled on an empty cache")
        blocks = get_block_sequence_ids_for_mask(types[:, :-1], device=valid.device)  # [B, P], -1 = text
        same_image = (blocks[:, :, None] == blocks[:, None, :]) & (blocks[:, :, None] >= 0)  # [B, P, P]
        width = valid.shape[1]
        causal = torch.ones(width, width, dtype=torch.bool, device=valid.device).tril()
        eye = torch.eye(width, dtype=torch.bool, device=valid.device)
        attend = ((causal | same_image) & valid[:, None, :] & valid[:, :, None]) | eye
        if positions is None:
            positions = (valid.long().cumsum(1) - 1).clamp_min(0)
        runner.chain_valid = valid[:, :0]
        runner.forward(positions, attend, **inputs)
        runner.chain_valid = valid
        runner.keep_chain(valid.sum(1))


FAMILY_TARGETS: dict[type, type[VLMTarget]] = {
    Gemma3ForConditionalGeneration: Gemma3Target,
}
SUPPORTED.update(FAMILY_TARGETS)
