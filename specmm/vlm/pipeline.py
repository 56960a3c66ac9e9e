"""SpeculativeVLM: images and prompts in, texts out, with a VLM target, its HF processor and any drafter.

Prompts go to the processor as they are (apply a chat template first if the model wants one), with one
exception: a prompt that does not contain the processor's image token gets `image_token + "\\n"` prepended,
so `generate(images, "Describe the picture.")` works with one image per prompt.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from PIL import Image
from torch import Tensor, nn

from specmm.core.acceptance import AcceptanceRule
from specmm.core.drafters import Drafter
from specmm.core.engine import GenerationStats, SpeculativeGenerator
from specmm.core.sampling import GREEDY, Generators, SamplingConfig
from specmm.core.target import as_target
from specmm.core.tree import TreeSpec
from specmm.vlm.targets import VLMTarget

logger = logging.getLogger(__name__)


@dataclass
class VLMGenerationResult:
    texts: list[str]  # the new tokens of each row, decoded without special tokens
    sequences: Tensor  # [B, L + n] processor input_ids (left-padded), then new tokens right-padded
    stats: GenerationStats
    prompt_length: int  # L: new tokens of row b are sequences[b, L : L + stats.new_tokens_per_row[b]]


def with_image_token(prompt: str, image_token: str) -> str:
    """The prompt, with `image_token + "\\n"` prepended when it holds no image token."""
    return prompt if image_token in prompt else f"{image_token}\n{prompt}"


class SpeculativeVLM:
    """A VLM target, its processor and a drafter (`EagleDrafter`, `ModelDrafter`, `VisionDrafter`, ...).

    `compile=True` runs the core's compiled mode (static caches, compiled forwards; identical outputs): the first
    batch of each new shape compiles, and `stats.compile_time_s` reports those seconds apart.
    """

    def __init__(self, target_model: nn.Module, processor, drafter: Drafter, tree: TreeSpec | None = None,
                 acceptance: str | AcceptanceRule = "exact", compile: bool = False):
        target = as_target(target_model)
        if not isinstance(target, VLMTarget):
            raise ValueError(f"target_model: {type(target_model).__name__} is not a vision-language model specmm "
                             "supports (LLaVA, LLaVA-NeXT, LLaVA-OneVision, Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Gemma 3, "
                             "Idefics3, SmolVLM, InternVL)")
        self.image_token = getattr(processor, "image_token", None)
        if not isinstance(self.image_token, str) or getattr(processor, "tokenizer", None) is None:
            raise ValueError(f"processor: {type(processor).__name__} is not a VLM processor (needs image_token and "
                             "tokenizer)")
        self.target, self.processor, self.tokenizer = target, processor, processor.tokenizer
        self.generator = SpeculativeGenerator(target, drafter, tree=tree, acceptance=acceptance, compile=compile)
        config = target.model.generation_config
        eos = config.eos_token_id if config.eos_token_id is not None else self.tokenizer.eos_token_id
        pad = next((p for p in (self.tokenizer.pad_token_id, config.pad_token_id) if p is not None), None)
        if pad is None:
            pad = eos if isinstance(eos, int) else (list(eos)[0] if eos else 0)
        self.eos_token_id, self.pad_token_id = eos, pad

    @property
    def model(self) -> nn.Module:
        return self.target.model

    def prepare(self, images: Sequence[Image.Image], prompts: Sequence[str] | str) -> dict:
        """Processor inputs for one prompt per image, left-padded (the engine decodes from the right edge)."""
        images = list(images) if not isinstance(images, Image.Image) else [images]
        if not images:
            raise ValueError("images: expected at least one PIL image")
        for i, image in enumerate(images):
            if not isinstance(image, Image.Image):
                raise ValueError(f"images: item {i} is a {type(image).__name__}, expected a PIL image")
        prompts = [prompts] * len(images) if isinstance(prompts, str) else list(prompts)
        if len(prompts) != len(images) or not all(isinstance(p, str) for p in prompts):
            raise ValueError(f"prompts: expected a string or {len(images)} strings (one per image), got "
                             f"{len(prompts)} items")
        texts = [with_image_token(p, self.image_token) for p in prompts]
        # one image per prompt, nested: multi-image processors (Gemma 3, ...) would read a flat list as one prompt's
        inputs = self.processor(images=[[image] for image in images], text=texts, return_tensors="pt", padding=True,
                                padding_side="left")
        return dict(inputs)

    def generate(self, images: Sequence[Image.Image], prompts: Sequence[str] | str, max_new_tokens: int = 128,
                 sampling: SamplingConfig = GREEDY, generator: Generators = None,
                 streamer=None) -> VLMGenerationResult:
        """Describe each image with its prompt; greedy (the default) gives exactly the target's own tokens."""
        inputs = self.prepare(images, prompts)
        out = self.generator.generate(**inputs, max_new_tokens=max_new_tokens, sampling=sampling,
                                      eos_token_id=self.eos_token_id, pad_token_id=self.pad_token_id,
                                      generator=generator, streamer=streamer)
        length = inputs["input_ids"].shape[1]
        rows = [seq[length: length + n] for seq, n in zip(out.sequences, out.stats.new_tokens_per_row)]
        texts = self.tokenizer.batch_decode(rows, skip_special_tokens=True)
        return VLMGenerationResult(texts=texts, sequences=out.sequences, stats=out.stats, prompt_length=length)
