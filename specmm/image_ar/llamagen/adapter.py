"""LlamaGen as an `ImageModel`: class ids or caption embeddings in, the guided LlamaGen target, its VQ codebook."""

from __future__ import annotations

import math

import torch
from PIL import Image
from torch import Tensor

from specmm.image_ar.images import to_pil
from specmm.image_ar.llamagen.model import LlamaGen
from specmm.image_ar.models import refuse_options
from specmm.image_ar.target import GuidedTarget


class LlamaGenImageModel:
    """The `ImageModel` of a LlamaGen (specmm's own implementation loading upstream checkpoints)."""

    compiles = True  # its target and parts have the compiled fast path (`ImageSampler(compile=True)`)

    def __init__(self, lg: LlamaGen):
        self.lg, self.target, self.lm = lg, GuidedTarget(lg.gpt), lg.gpt
        self.tokens_per_image = lg.config.block_size

    def conditioning(self, conditions, cfg_scale: float, max_nodes: int, cfg_interval: int = -1,
                     caption_mask: Tensor | None = None, **options) -> tuple[Tensor, dict]:
        """Class ids [B] or caption embeddings [B, T, D] -> an empty prompt plus the conditioning inputs."""
        refuse_options(options, "LlamaGen")
        check_cfg_scale(cfg_scale)
        c = self.lg.config
        if cfg_scale > 1.0 and c.model_type == "c2i" and not c.has_null_class:
            raise ValueError("cfg_scale: guidance needs a null class, but the GPT was built with "
                             "class_dropout_prob=0 (no null-class embedding)")
        conditions = self.lg.check_conditions(conditions)
        check_caption_mask(caption_mask, conditions, c.model_type, c.cls_token_num)
        prompt = torch.zeros(conditions.shape[0], 0, dtype=torch.long, device=self.target.device)
        return prompt, dict(conditions=conditions, cfg_scale=cfg_scale, cfg_interval=cfg_interval,
                            max_nodes=max_nodes, caption_mask=caption_mask)

    def codebook(self) -> Tensor:
        return self.lg.vq.quantize.codebook().detach()

    def image_tokens(self, sequences: Tensor) -> Tensor:
        return sequences[:, : self.tokens_per_image]

    def decode(self, tokens: Tensor) -> list[Image.Image]:
        return to_pil(self.lg.decode(tokens))


def check_caption_mask(caption_mask, conditions: Tensor, model_type: str, tokens: int) -> None:
    """A t2i caption mask is a [B, cls_token_num] tensor over the caption embeddings (1 = real token), else
    ValueError; class-conditional models take none."""
    if caption_mask is None:
        return
    if model_type != "t2i":
        raise ValueError("caption_mask: only a text-conditional (t2i) LlamaGen takes one; class ids have no padding")
    if not isinstance(caption_mask, Tensor):
        raise ValueError(f"caption_mask: expected a tensor, got {type(caption_mask).__name__}")
    if tuple(caption_mask.shape) != (conditions.shape[0], tokens):
        raise ValueError(f"caption_mask: expected shape [{conditions.shape[0]}, {tokens}] (one entry per caption "
                         f"embedding of each row), got {list(caption_mask.shape)}")


def check_cfg_scale(cfg_scale) -> None:
    """A finite guidance scale >= 1 (1 disables guidance), else ValueError."""
    if not isinstance(cfg_scale, (int, float)) or isinstance(cfg_scale, bool) or not math.isfinite(cfg_scale):
        raise ValueError(f"cfg_scale: expected a finite number >= 1, got {cfg_scale!r}")
    if cfg_scale < 1.0:
        raise ValueError(f"cfg_scale: guidance scale must be >= 1 (1 disables guidance), got {cfg_scale}")
