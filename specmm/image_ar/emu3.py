"""Emu3 as an `ImageModel`: text prompts through its `Emu3Processor` (as the HF docs build them), the guided Emu3
target (`emu3_target`), its VQ codebook, decoding through the model's own `Emu3VQVAE`, and the drafter's view."""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from PIL import Image
from torch import Tensor, nn

from specmm.image_ar.emu3_target import Emu3Target, Emu3Vocabulary
from specmm.image_ar.images import to_pil
from specmm.image_ar.llamagen.adapter import check_cfg_scale
from specmm.image_ar.llamagen.config import GPTConfig
from specmm.image_ar.models import check_token_ids, refuse_options, register_image_model


class Emu3DrafterView(nn.Module):
    """What an `ImageDrafter` reads of an Emu3 target: a head config over the decoder's width, the model's token
    embeddings and LM head restricted to the visual codes. The head's 2-D RoPE grid is the image's width when that
    square covers the image, else the smallest square that does."""

    def __init__(self, model: nn.Module, target: Emu3Target):
        super().__init__()
        text = model.config.get_text_config()
        grid = max(target.grid_size, math.ceil(math.sqrt(target.tokens_per_image)))
        self.config = GPTConfig(dim=text.hidden_size, n_layer=text.num_hidden_layers, n_head=text.num_attention_heads,
                                n_kv_head=text.num_key_value_heads, norm_eps=text.rms_norm_eps, num_classes=0,
                                vocab_size=target.vocab_size, block_size=grid * grid)
        self.tok_embeddings = CodeEmbedding(model.get_input_embeddings(), target.visual)
        self.head, self.visual = model.get_output_embeddings(), target.visual

    def logits(self, features: Tensor) -> Tensor:
        """Final-norm features [..., d] -> logits [..., K] over the visual codes."""
        return self.head(features)[..., self.visual]


class CodeEmbedding(nn.Module):
    """The model's token embedding, indexed by VQ code."""

    def __init__(self, embedding: nn.Embedding, visual: Tensor):
        super().__init__()
        self.embedding, self.visual = embedding, visual

    @property
    def weight(self) -> Tensor:
        return self.embedding.weight

    def forward(self, ids: Tensor) -> Tensor:
        return self.embedding(self.visual[ids])


class Emu3ImageModel:
    """The `ImageModel` of a stock `Emu3ForConditionalGeneration`: text prompts in (through its `Emu3Processor`,
    as the HF docs build them), images of `height` x `width` latent tokens out (default: the processor's ratio and
    image area), guidance against `negative_prompt` (None: the prompt's last token, as HF without one).

    Sampled tokens are the VQ codes in raster order, height * width per image; `target.sequences(tokens)` puts the
    forced tokens back: the ids `generate` returns after the prompt (each row's end-of-line, then EOF, EOI, EOS)."""

    compiles = True  # `ImageSampler(compile=True)`: the model's forwards run compiled over static caches

    def __init__(self, model: nn.Module, processor=None, height: int | None = None, width: int | None = None,
                 negative_prompt: str | Tensor | None = None):
        if type(model).__name__ != "Emu3ForConditionalGeneration":
            raise ValueError(f"model: expected an Emu3ForConditionalGeneration, got {type(model).__name__}")
        if (height is None) != (width is None):
            raise ValueError("height, width: give both latent sizes or neither (the processor's default)")
        if height is None:
            ratio, area = getattr(processor, "ratio", "1:1"), getattr(processor, "image_area", 518400)
            height, width = generate_size(ratio, area, getattr(processor, "downsample_ratio", 8))
        self.emu3, self.processor, self.negative_prompt = model, processor, negative_prompt
        self.target = Emu3Target(model, height, width, Emu3Vocabulary.of(model, processor))
        self.tokens_per_image = self.target.tokens_per_image
        self.lm = Emu3DrafterView(model, self.target)

    def conditioning(self, conditions, cfg_scale: float, max_nodes: int, cfg_interval: int = -1,
                     caption_mask: Tensor | None = None, **options) -> tuple[Tensor, dict]:
        """Text prompts (a processor needed), or their ids [B, L] (left-padded, with `caption_mask` as the
        attention mask) -> an empty prompt plus the target's inputs. Option: `negative_prompt` (this call's; default
        the adapter's)."""
        negative_prompt = options.pop("negative_prompt", None)
        refuse_options(options, "Emu3")
        check_cfg_scale(cfg_scale)
        if cfg_interval != -1:
            raise ValueError(f"cfg_interval: Emu3 guides every token (HF has no guidance interval), got {cfg_interval}")
        ids, mask = self._tokens(conditions, caption_mask, image_prompt=True)
        negative = self._negative(negative_prompt, ids.shape[0], cfg_scale)
        prompt = torch.zeros(ids.shape[0], 0, dtype=torch.long, device=self.target.device)
        return prompt, dict(prompt_ids=ids, prompt_mask=mask, negative_prompt_ids=negative.get("negative_prompt_ids"),
                            negative_prompt_attention_mask=negative.get("negative_prompt_attention_mask"),
                            guidance_scale=cfg_scale, max_nodes=max_nodes)

    @torch.no_grad()
    def hf_generate(self, prompts, cfg_scale: float, negative_prompt=None, **generate_kwargs) -> Tensor:
        """The stock `generate` call this adapter reproduces, as the HF docs make it (the prompts' image size, the
        docs' `prefix_allowed_tokens_fn`, guidance against the negative prompt: `negative_prompt`, default the
        adapter's) -> its codes [B, H*W] (`generate_kwargs`: e.g. `do_sample=False`, a static cache)."""
        check_cfg_scale(cfg_scale)
        ids, mask = self._tokens(prompts, None, image_prompt=True)
        negative = self._negative(negative_prompt, ids.shape[0], cfg_scale)
        device, target = self.target.device, self.target
        negative = {name: value.to(device) for name, value in negative.items()}
        out = self.emu3.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                                 max_new_tokens=(target.width + 1) * target.height + 3, guidance_scale=cfg_scale,
                                 prefix_allowed_tokens_fn=target.allowed_tokens(), **negative, **generate_kwargs)
        return target.codes(out[:, ids.shape[1]:])

    def _negative(self, negative_prompt, rows: int, cfg_scale: float) -> dict:
        """`generate`'s negative-prompt inputs for `rows` prompts: `negative_prompt` (None: the adapter's), {}
        without guidance or a negative prompt (HF then guides against each prompt's last token); one negative
        prompt serves every row."""
        negative_prompt = self.negative_prompt if negative_prompt is None else negative_prompt
        if negative_prompt is None or cfg_scale == 1:
            return {}
        ids, mask = self._tokens(negative_prompt, None, image_prompt=False)
        if ids.shape[0] not in (1, rows):
            raise ValueError(f"negative_prompt: {ids.shape[0]} negative prompts for {rows} prompts (give one, or "
                             "one per prompt)")
        return dict(negative_prompt_ids=ids.expand(rows, -1), negative_prompt_attention_mask=mask.expand(rows, -1))

    def _tokens(self, texts, mask: Tensor | None, image_prompt: bool) -> tuple[Tensor, Tensor]:
        if isinstance(texts, str):
            texts = [texts]
        if isinstance(texts, Mapping):  # what a processor or tokenizer returns
            texts, mask = texts["input_ids"], texts.get("attention_mask")
        if isinstance(texts, Tensor):
            check_token_ids(texts, mask, "conditions" if image_prompt else "negative_prompt")
            return texts, torch.ones_like(texts) if mask is None else mask
        if self.processor is None:
            raise ValueError("conditions: text prompts need the model's Emu3Processor (or pass token ids [B, L])")
        if not isinstance(texts, list | tuple) or not texts or not all(isinstance(t, str) for t in texts):
            raise ValueError(f"conditions: expected text prompts or token ids [B, L], got {type(texts).__name__}")
        height, width, factor = self.target.height, self.target.width, self.processor.downsample_ratio
        extra = dict(return_for_image_generation=True, ratio=f"{width}:{height}",  # asks for exactly height x width
                     image_area=height * width * factor * factor) if image_prompt else {}
        out = self.processor(text=list(texts), padding=True, padding_side="left", return_tensors="pt", **extra)
        return out["input_ids"], out["attention_mask"]

    def codebook(self) -> Tensor:
        """[K, d]: the VQ codebook (`Emu3VQVAE`'s quantizer)."""
        return self.emu3.model.vqmodel.quantize.embedding.weight.detach()

    def image_tokens(self, sequences: Tensor) -> Tensor:
        return sequences[:, : self.tokens_per_image]

    @torch.no_grad()
    def decode(self, tokens: Tensor) -> list[Image.Image]:
        """Codes [B, H*W] -> PIL images: the model's own `decode_image_tokens` (Emu3VQVAE) on the sequence
        `generate` would return, then the processor's `postprocess` (or [-1, 1] pixels to bytes without one)."""
        target = self.target
        pixels = self.emu3.decode_image_tokens(image_tokens=target.sequences(tokens), height=target.height,
                                               width=target.width)
        if self.processor is None:
            return to_pil(pixels)
        return self.processor.postprocess(list(pixels.float()), return_tensors="PIL.Image.Image")["pixel_values"]


def generate_size(ratio: str, image_area: int, downsample: int) -> tuple[int, int]:
    """Latent (height, width) for a "W:H" ratio and a pixel area, as `Emu3Processor.calculate_generate_size`."""
    width, height = map(int, ratio.split(":"))
    scale = (image_area / (width * height)) ** 0.5
    return int(round(height * scale / downsample)), int(round(width * scale / downsample))


def _build(model: nn.Module, processor=None, latent_size: tuple[int, int] | None = None) -> Emu3ImageModel:
    height, width = latent_size or (None, None)
    return Emu3ImageModel(model, processor, height=height, width=width)


register_image_model("Emu3ForConditionalGeneration", _build, sized=True)
