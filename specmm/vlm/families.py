"""Target adapters for more VLM families: Gemma 3, SmolVLM / Idefics3, LLaVA-OneVision, Qwen2-VL, Qwen3-VL and
InternVL. Each keeps the prompt prefill in the model's own forward (vision tower, projector, merge, DeepStack)
and says only what differs: its inputs, image- and video-token counts, prompt mask and positions. Importing this
module (done by `specmm.vlm`) adds them to `targets.SUPPORTED`. InternVL and SmolVLM take videos through their
processors, as image frames (`pixel_values` and image tokens), so the image path serves them.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn
from transformers import (
    Gemma3ForConditionalGeneration,
    Idefics3ForConditionalGeneration,
    InternVLForConditionalGeneration,
    LlavaOnevisionForConditionalGeneration,
    Qwen2VLForConditionalGeneration,
    Qwen3VLForConditionalGeneration,
    SmolVLMForConditionalGeneration,
)
from transformers.models.gemma3.modeling_gemma3 import get_block_sequence_ids_for_mask
from transformers.models.llava_next.modeling_llava_next import get_anyres_image_grid_shape, unpad_image

from specmm.vlm.targets import SUPPORTED, LlavaTarget, Qwen2_5_VLTarget, VLMTarget, _square_size

VIDEO_AS_FRAMES = ("takes videos as image frames: pass the processor's pixel_values and image tokens for them "
                   "(it returns no pixel_values_videos)")


class Gemma3Target(VLMTarget):
    """`Gemma3ForConditionalGeneration`: `mm_tokens_per_image` tokens per image; with `token_type_ids` (as the
    processor returns them) the tokens of one image attend to each other bidirectionally in the prompt, exactly
    as HF's prefill mask (causal OR same-image block, then the sliding window on local layers)."""

    model_input_names = ("pixel_values", "token_type_ids")
    token_types_name = "token_type_ids"

    def __init__(self, model: nn.Module):
        if getattr(model.config.get_text_config(), "use_bidirectional_attention", False):
            raise ValueError("target: this Gemma 3 attends bidirectionally over every token "
                             "(use_bidirectional_attention), so it cannot decode autoregressively")
        super().__init__(model)

    def tokens_per_image(self, model_inputs: dict) -> list[int] | None:
        return [int(self.model.config.mm_tokens_per_image)] * model_inputs["pixel_values"].shape[0]

    def fixed_image_size(self) -> tuple[int, int, int] | None:
        return _square_size(self.model.config.vision_config)

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


class Idefics3Target(VLMTarget):
    """`Idefics3ForConditionalGeneration` and `SmolVLMForConditionalGeneration`: pixel values per prompt row
    ([B, images, C, H, W], all-zero images are padding), each real image (or image tile) filling `image_seq_len`
    pixel-shuffled tokens; plain 1-D positions."""

    model_input_names = ("pixel_values", "pixel_attention_mask")

    @property
    def video_note(self) -> str:
        if isinstance(self.model, SmolVLMForConditionalGeneration):
            return VIDEO_AS_FRAMES
        return VLMTarget.video_note

    @property
    def language_model(self) -> nn.Module:
        return self.model.model.text_model

    def _check_shapes(self, model_inputs: dict) -> None:
        pixels, pixel_mask = model_inputs.get("pixel_values"), model_inputs.get("pixel_attention_mask")
        if pixels is None:
            if pixel_mask is not None:
                raise ValueError("pixel_attention_mask: given without pixel_values")
            return
        if pixels.dim() != 5:
            raise ValueError(f"pixel_values: expected [prompts, images, channels, height, width] as the Idefics3 / "
                             f"SmolVLM processor returns them, got shape {tuple(pixels.shape)}")
        if pixel_mask is not None and pixel_mask.shape != (*pixels.shape[:2], *pixels.shape[3:]):
            raise ValueError(f"pixel_attention_mask: shape {tuple(pixel_mask.shape)} does not match pixel_values "
                             f"{tuple(pixels.shape)} (expected [prompts, images, height, width])")

    def check_images(self, input_ids: Tensor, attention_mask: Tensor, model_inputs: dict) -> None:
        pixels = model_inputs.get("pixel_values")
        if pixels is not None and pixels.shape[0] != input_ids.shape[0]:
            raise ValueError(f"pixel_values: {pixels.shape[0]} prompt rows but input_ids has {input_ids.shape[0]}")
        super().check_images(input_ids, attention_mask, model_inputs)

    def tokens_per_image(self, model_inputs: dict) -> list[int] | None:
        real = model_inputs["pixel_values"].flatten(2).ne(0).any(-1)  # [B, images] not a padding image
        return [int(self.model.model.image_seq_len)] * int(real.sum())


class LlavaOnevisionTarget(LlavaTarget):
    """`LlavaOnevisionForConditionalGeneration`: anyres tiles for a prompt's only image, one tile per image of a
    multi-image prompt (`batch_num_images`), unpadded grids shrunk to `anyres_max_N` tiles; videos
    ([videos, frames, C, H, W]) fill each frame's 2x2-pooled patch grid and one newline token."""

    model_input_names = ("pixel_values", "image_sizes", "batch_num_images")
    video_input_names = ("pixel_values_videos",)

    def __init__(self, model: nn.Module):
        VLMTarget.__init__(self, model)
        self.anyres, self.sized_tower = True, False  # SigLIP tiles of one size

    def _check_shapes(self, model_inputs: dict) -> None:
        super()._check_shapes(model_inputs)
        videos = model_inputs.get("pixel_values_videos")
        if videos is not None and videos.dim() != 5:
            raise ValueError(f"pixel_values_videos: expected [videos, frames, channels, height, width], got shape "
                             f"{tuple(videos.shape)}")
        self.check_pixel_size(videos, "pixel_values_videos")

    def tokens_per_video(self, model_inputs: dict) -> list[int]:
        videos = model_inputs["pixel_values_videos"]
        vision = self.model.config.vision_config
        pooled = math.ceil(vision.image_size // vision.patch_size / 2)  # bilinear pooling to half size, rounded up
        return [videos.shape[1] * pooled * pooled + 1] * videos.shape[0]

    def tokens_per_image(self, model_inputs: dict) -> list[int] | None:
        sizes = model_inputs["image_sizes"].tolist()
        per_prompt = model_inputs.get("batch_num_images")
        tiled = [True] * len(sizes) if per_prompt is None else [n == 1 for n in per_prompt.tolist() for _ in range(n)]
        if len(tiled) != len(sizes):
            raise ValueError(f"batch_num_images: counts {len(tiled)} images but image_sizes has {len(sizes)} rows")
        side = self.model.config.vision_config.image_size // self.model.config.vision_config.patch_size
        return [self._onevision_tokens(size, side) if tile else side * side + 1 for size, tile in zip(sizes, tiled)]

    def _onevision_tokens(self, size: list[int], side: int) -> int:
        """Base tile + the unpadded grid (bilinearly shrunk past `anyres_max_N` tiles) with a newline per row."""
        config = self.model.config
        rows, cols = get_anyres_image_grid_shape(size, config.image_grid_pinpoints, config.vision_config.image_size)
        _, height, width = unpad_image(torch.empty(0, rows * side, cols * side), size).shape
        ratio = math.sqrt(height * width / (int(config.vision_aspect_ratio.strip("anyres_max_")) * side**2))
        if ratio > 1.1:
            height, width = int(height // ratio), int(width // ratio)
        return side * side + height * (width + 1)


class InternVLTarget(VLMTarget):
    """`InternVLForConditionalGeneration`: pixel values are image tiles ([tiles, C, H, W]; the processor puts
    one image's tiles in one span), each tile filling (side * downsample_ratio)^2 pixel-shuffled tokens."""

    video_note = VIDEO_AS_FRAMES

    def tokens_per_image(self, model_inputs: dict) -> list[int] | None:
        config = self.model.config
        if config.vision_feature_select_strategy != "default":
            return None
        size, patch = config.vision_config.image_size, config.vision_config.patch_size
        size, patch = (size[0] if isinstance(size, (list, tuple)) else size), (
            patch[0] if isinstance(patch, (list, tuple)) else patch)
        side = int(size // patch * config.downsample_ratio)
        return [side * side] * model_inputs["pixel_values"].shape[0]


FAMILY_TARGETS: dict[type, type[VLMTarget]] = {
    Gemma3ForConditionalGeneration: Gemma3Target,
    Idefics3ForConditionalGeneration: Idefics3Target,
    SmolVLMForConditionalGeneration: Idefics3Target,
    LlavaOnevisionForConditionalGeneration: LlavaOnevisionTarget,
    Qwen2VLForConditionalGeneration: Qwen2_5_VLTarget,
    Qwen3VLForConditionalGeneration: Qwen2_5_VLTarget,  # interleaved M-RoPE, DeepStack: see Qwen2_5_VLTarget
    InternVLForConditionalGeneration: InternVLTarget,
}
SUPPORTED.update(FAMILY_TARGETS)
