"""Target adapters for stock HF vision-language models: LLaVA, LLaVA-NeXT and Qwen2.5-VL (Qwen2-VL and Qwen3-VL
also use `Qwen2_5_VLTarget`; the other families are in `families.py`).

The prompt, image tokens included, is prefilled through the model's own forward, so the vision tower, the
projector and the embedding merge stay stock code; generated tokens are then verified exactly like a text
LM's (`HFCausalLMTarget`). Qwen2.5-VL adds M-RoPE: the prompt gets the model's own 3-D positions
(`get_rope_index`) and every later token `committed length + depth + rope_delta` on all three axes, as HF
`generate` does. Families whose stock forward takes videos (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, LLaVA-OneVision)
get them in the prefill the same way; later tokens are text. Importing `specmm.vlm` registers these adapters
with `specmm.core.as_target`.
"""

from __future__ import annotations

import inspect
import itertools
import logging
from typing import Any

import torch
from torch import Tensor, nn
from transformers import (
    LlavaForConditionalGeneration,
    LlavaNextForConditionalGeneration,
    Qwen2_5_VLForConditionalGeneration,
)
from transformers.models.llava_next.modeling_llava_next import get_anyres_image_grid_shape, unpad_image

from specmm.core.target import (
    FEATURES,
    INPUTS_EMBEDS,
    HFCausalLMTarget,
    PrefillOutput,
    TargetOutput,
    register_target_adapter,
)
from specmm.core.tree import DraftTree

logger = logging.getLogger(__name__)


class _InputsEmbedsCapture:
    """Forward pre-hook keeping the `inputs_embeds` a module is called with (the merged prompt embeddings)."""

    def __init__(self, module: nn.Module):
        self.value: Tensor | None = None
        self._handle = module.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs) -> None:
        self.value = kwargs.get("inputs_embeds")

    def close(self) -> None:
        self._handle.remove()


# PrefillOutput.extras keys: IMAGE_MASK marks the visual tokens (image tokens, and video tokens where the family
# takes videos), whose spans drafters compress; IMAGE_ATTENTION holds DREAM's last-layer attention scores
IMAGE_MASK, IMAGE_ATTENTION = "image_mask", "image_attention"


class _LastLayerAttention:
    """Attention each prompt position receives in the last layer (mean over heads and the queries that see
    it), for drafters that prune image tokens by it (DREAM). The last layer's attention is re-run once in
    eager mode on its captured inputs, so the prefill itself (and its cache) stays the stock computation."""

    def __init__(self, language_model: nn.Module):
        self.module = language_model.layers[-1].self_attn
        self.kwargs: dict = {}
        self._handle = self.module.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs) -> None:
        self.kwargs = dict(kwargs)

    def close(self) -> None:
        self._handle.remove()

    def scores(self) -> Tensor:
        """[B, L-1] attention received per position (rows: the prefill block)."""
        # no cache: the re-run must not write the block into it again (transformers 5.24 renamed the attention
        # modules' `past_key_values` to `cache`; both names are dropped)
        kwargs = {k: v for k, v in self.kwargs.items() if k not in ("past_key_values", "past_key_value", "cache")}
        # [B, 1, n, n] over the block: the cache was empty at prefill, so the block sits in its first n slots
        # (a static cache's mask covers the whole buffer; the rest of it is empty)
        mask = kwargs["attention_mask"][..., : kwargs["hidden_states"].shape[1]]
        sees = mask if mask.dtype == torch.bool else mask == 0
        dtype = kwargs["hidden_states"].dtype
        kwargs["attention_mask"] = torch.zeros(sees.shape, dtype=dtype, device=sees.device).masked_fill(
            ~sees, torch.finfo(dtype).min)
        config = self.module.config
        backend = config._attn_implementation
        config._attn_implementation = "eager"
        try:
            weights = self.module(**kwargs)[1].float().mean(1)  # [B, n, n]
        finally:
            config._attn_implementation = backend
        queries = sees[:, 0].float()  # [B, n, n] which query sees which key
        return (weights * queries).sum(1) / queries.sum(1).clamp_min(1.0)


class VLMTarget(HFCausalLMTarget):
    """Shared VLM adapter: input checks, image-count checks and a prefill that also returns the merged
    input embeddings and the image mask. Subclasses say which inputs they take and how many image
    tokens each image fills."""

    provides = frozenset({FEATURES, INPUTS_EMBEDS, IMAGE_ATTENTION})
    model_input_names: tuple[str, ...] = ("pixel_values",)
    video_input_names: tuple[str, ...] = ()  # the stock forward's video inputs (empty: the family takes no videos)
    video_note = "takes no videos"  # what the refusal of video inputs tells
    token_types_name: str | None = None  # per-token type input over the full prompt (1 = image), if the family has one

    def __init__(self, model: nn.Module):
        super().__init__(model)
        self.image_token_id = int(model.config.image_token_id)
        self.video_token_id = int(model.config.video_token_id) if self.video_input_names else None
        self._images_given = False

    @property
    def embed_tokens(self) -> nn.Module:
        """The target's (frozen) token embedding, shared with drafters."""
        return self.model.get_input_embeddings()

    @property
    def lm_head(self) -> nn.Module:
        return self.model.get_output_embeddings()

    @property
    def language_model(self) -> nn.Module:
        """The inner decoder: it is called with the merged embeddings (image rows = projected vision features)."""
        return self.model.model.language_model

    # ------------------------------------------------------------------------------------------- checks

    def check_model_inputs(self, model_inputs: dict) -> None:
        """Raise ValueError for inputs this target does not take or whose shapes cannot fit (before any work)."""
        names = self.model_input_names + self.video_input_names
        unknown = sorted(set(model_inputs) - set(names))
        if unknown:
            note = f"; {type(self.model).__name__} {self.video_note}" if any("video" in n for n in unknown) else ""
            raise ValueError(f"{', '.join(unknown)}: not an input of {type(self).__name__} "
                             f"({type(self.model).__name__}); it takes {', '.join(names)}{note}")
        for name, value in model_inputs.items():
            if not isinstance(value, Tensor):
                raise ValueError(f"{name}: expected a tensor, got {type(value).__name__}")
        self._check_shapes(model_inputs)

    def _check_shapes(self, model_inputs: dict) -> None:
        pixels = model_inputs.get("pixel_values")
        if pixels is not None and pixels.dim() != 4:
            raise ValueError(f"pixel_values: expected [images, channels, height, width], got shape "
                             f"{tuple(pixels.shape)}")
        self.check_pixel_size(pixels)

    def fixed_image_size(self) -> tuple[int, int, int] | None:
        """(channels, height, width) every image (or tile) must have, for towers of one input size; else None."""
        return None

    def check_pixel_size(self, pixels: Tensor | None, name: str = "pixel_values") -> None:
        """Images of another size than a fixed-size tower's fail deep inside it (SigLIP: a shape error)."""
        expected = self.fixed_image_size()
        if pixels is None or expected is None or tuple(pixels.shape[-3:]) == expected:
            return
        raise ValueError(f"{name}: images of [channels, height, width] {list(pixels.shape[-3:])}, but the "
                         f"{type(self.model).__name__} vision tower takes {list(expected)}: resize them with the "
                         "model's processor")

    def tokens_per_image(self, model_inputs: dict) -> list[int] | None:
        """Image tokens each image of `model_inputs` fills in input_ids (None when it cannot be told cheaply)."""
        raise NotImplementedError

    def tokens_per_video(self, model_inputs: dict) -> list[int]:
        """Video tokens each video of `model_inputs` fills in input_ids (families with `video_input_names`)."""
        raise NotImplementedError

    def visual_mask(self, input_ids: Tensor) -> Tensor:
        """[B, L] bool: image tokens, and video tokens where the family takes videos (drafters see both as visual)."""
        mask = input_ids == self.image_token_id
        return mask if self.video_token_id is None else mask | (input_ids == self.video_token_id)

    def last_token_is_image(self, model_inputs: dict) -> Tensor | None:
        """[B] bool: rows whose last prompt token is an image (or video) token, when the inputs tell (else None)."""
        types = model_inputs.get(self.token_types_name) if self.token_types_name else None
        return None if types is None else types[:, -1] != 0

    def check_token_types(self, input_ids: Tensor, attention_mask: Tensor, model_inputs: dict) -> None:
        """The token-type input (full prompt, [B, L]) must mark exactly the image tokens (1) and video tokens (2)."""
        name = self.token_types_name
        types = model_inputs.get(name) if name else None
        if types is None:
            return
        if types.shape != (input_ids.shape[0], input_ids.shape[1] + 1):
            raise ValueError(f"{name}: shape {tuple(types.shape)} does not match input_ids "
                             f"{(input_ids.shape[0], input_ids.shape[1] + 1)}")
        kinds = [("image", 1, self.image_token_id)]
        if self.video_token_id is not None:
            kinds.append(("video", 2, self.video_token_id))
        for kind, value, token in kinds:
            marked = types[:, :-1].to(input_ids.device) == value
            if bool(((marked != (input_ids == token)) & attention_mask.bool()).any()):
                raise ValueError(f"{name}: does not mark exactly the {kind} tokens of input_ids"
                                 + (f" (as {value})" if len(kinds) > 1 else ""))

    def check_images(self, input_ids: Tensor, attention_mask: Tensor, model_inputs: dict) -> None:
        """Raise ValueError when images and image tokens disagree. Called by `prefill` before any forward, on
        the prompt minus its last token (the engine verifies that token as the first root, without pixels)."""
        _check_padding(input_ids, attention_mask, self.image_token_id, "image")
        if self.video_token_id is not None:
            _check_padding(input_ids, attention_mask, self.video_token_id, "video")
        self.check_token_types(input_ids, attention_mask, model_inputs)
        is_image = (input_ids == self.image_token_id) & attention_mask.bool()  # [B, L-1]
        found = int(is_image.sum())
        last_image = self.last_token_is_image(model_inputs)
        if last_image is not None and bool(last_image.any()):
            types = model_inputs[self.token_types_name]
            _raise_last_token_image(last_image, "video" if bool((types[:, -1] == 2).any()) else "image")
        if model_inputs.get("pixel_values") is None:
            if found:
                raise ValueError(f"input_ids: hold {found} image tokens (id {self.image_token_id}) but no "
                                 "pixel_values were given")
            return
        counts = self.tokens_per_image(model_inputs)
        expected = None if counts is None else sum(counts)
        if found == expected:
            return _check_span_order(is_image, counts, "image", "pixel_values")
        ends_in_image = is_image[:, -1] if input_ids.shape[1] else is_image.new_zeros(input_ids.shape[0])
        if last_image is None and expected is not None and 0 < expected - found == int(ends_in_image.sum()):
            _raise_last_token_image(ends_in_image)  # each such row's missing image token is its last token
        if found == 0:
            raise ValueError(f"pixel_values: given but input_ids hold no image tokens (id {self.image_token_id}); "
                             "put the processor's image token in the prompt")
        if counts is None:
            return
        runs = int((is_image[:, 1:] & ~is_image[:, :-1]).sum() + is_image[:, 0].sum())  # contiguous image spans
        raise ValueError(_count_mismatch(counts, found, runs))

    def check_videos(self, input_ids: Tensor, attention_mask: Tensor, model_inputs: dict) -> None:
        """Raise ValueError when videos and video tokens disagree (before any forward; the prompt minus its last
        token, as in `check_images`)."""
        if self.video_token_id is None:
            return
        is_video = (input_ids == self.video_token_id) & attention_mask.bool()  # [B, L-1]
        found = int(is_video.sum())
        if model_inputs.get("pixel_values_videos") is None:
            if found:
                raise ValueError(f"input_ids: hold {found} video tokens (id {self.video_token_id}) but no "
                                 "pixel_values_videos were given")
            return
        counts = self.tokens_per_video(model_inputs)
        if found == sum(counts):
            return _check_span_order(is_video, counts, "video", "pixel_values_videos")
        ends_in_video = is_video[:, -1] if input_ids.shape[1] else is_video.new_zeros(input_ids.shape[0])
        if 0 < sum(counts) - found == int(ends_in_video.sum()):
            _raise_last_token_image(ends_in_video, "video")
        if found == 0:
            raise ValueError(f"pixel_values_videos: given but input_ids hold no video tokens (id "
                             f"{self.video_token_id}); put the processor's video token in the prompt")
        raise ValueError(f"pixel_values_videos: {len(counts)} videos need {sum(counts)} video tokens "
                         f"({', '.join(map(str, counts))}) but input_ids hold {found}")

    # ------------------------------------------------------------------------------------------ running

    def forward_inputs(self, model_inputs: dict) -> dict:
        """The model inputs passed to the prefill forward, on the target's device (token types cover the full
        prompt and only shape masks or positions, which the adapter gives explicitly)."""
        return {k: v.to(self.device) for k, v in model_inputs.items() if k != self.token_types_name}

    def extend_prompt(self, valid: Tensor, positions: Tensor | None, model_inputs: dict, **inputs: Any) -> None:
        """Run and commit the prompt prefix (causal attention; Gemma 3 overrides it)."""
        self.runner.extend(valid, positions=positions, **inputs)

    def prefill_positions(self, input_ids: Tensor, attention_mask: Tensor, model_inputs: dict) -> Tensor | None:
        """Positions of the prefix ([B, L-1], or [3, B, L-1] for M-RoPE); None: continue each row's count."""
        return None

    @torch.no_grad()
    def prefill(self, input_ids: Tensor, attention_mask: Tensor, **model_inputs: Any) -> PrefillOutput:
        self.check_images(input_ids, attention_mask, model_inputs)
        self.check_videos(input_ids, attention_mask, model_inputs)
        self._images_given = any(model_inputs.get(k) is not None for k in ("pixel_values", "pixel_values_videos"))
        valid = attention_mask.bool()  # [B, L-1]
        extras = {IMAGE_MASK: self.visual_mask(input_ids) & valid}  # [B, L-1]
        positions = self.prefill_positions(input_ids, attention_mask, model_inputs)
        extras.update(self.prefill_extras())
        if input_ids.shape[1] == 0:
            return PrefillOutput(extras=extras)
        capture = _InputsEmbedsCapture(self.language_model) if INPUTS_EMBEDS in self.needs else None
        attention = _LastLayerAttention(self.language_model) if IMAGE_ATTENTION in self.needs else None
        try:
            self.extend_prompt(valid, positions, model_inputs, input_ids=input_ids, logits_to_keep=1,
                               **self.forward_inputs(model_inputs))
            if attention is not None:
                extras[IMAGE_ATTENTION] = attention.scores()  # [B, L-1]
        finally:
            for hook in (capture, attention):
                if hook is not None:
                    hook.close()
        return PrefillOutput(features=self.runner.captured, extras=extras,
                             inputs_embeds=capture.value if capture is not None else None)

    def prefill_extras(self) -> dict:
        return {}

    def check_roots(self, roots: Tensor) -> None:
        """The first roots [B] after an image (or video) prefill (the engine's `begin` asks): an image token means the
        prompt ended inside an image, which the prefix counts could not show (more image tokens than features)."""
        if self._images_given:
            self._images_given = False
            for kind, token in (("image", self.image_token_id), ("video", self.video_token_id)):
                rows = roots == token  # [B]
                if token is not None and bool(rows.any()):
                    _raise_last_token_image(rows, kind)


def _raise_last_token_image(rows: Tensor, kind: str = "image") -> None:
    raise ValueError(f"input_ids: the last prompt token of row(s) {rows.nonzero().flatten().tolist()} is "
                     f"{'an' if kind == 'image' else 'a'} {kind} token; end each prompt with text after the {kind} "
                     "(the last prompt token is verified as the first draft root, without pixels)")


def _check_span_order(is_visual: Tensor, counts: list[int], kind: str, name: str) -> None:
    """With one token span per image (row by row, in order), each span must fill its image's tokens: the stock
    merge fills spans in order, so swapped images would take each other's features, or M-RoPE would fail."""
    spans = [len(list(group)) for row in is_visual.tolist() for key, group in itertools.groupby(row) if key]
    if len(spans) == len(counts) and spans != counts:
        raise ValueError(f"{name}: its {kind}s fill {counts} tokens in order, but the {kind}-token spans of "
                         f"input_ids (row by row) hold {spans}: give the {kind}s in the order of their spans")


def _count_mismatch(counts: list[int], found: int, runs: int) -> str:
    """'pixel_values: 2 images but input_ids hold image tokens for 3' when the counts (or, failing that, the
    number of contiguous image-token spans) tell, else the totals."""
    images = len(counts)
    holds = None
    if counts and all(c == counts[0] for c in counts) and found % counts[0] == 0:
        holds = found // counts[0]
    elif found in itertools.accumulate(counts):
        holds = list(itertools.accumulate(counts)).index(found) + 1
    elif runs != images:
        holds = runs
    if holds is not None:
        return f"pixel_values: {images} images but input_ids hold image tokens for {holds}"
    return (f"pixel_values: {images} images need {sum(counts)} image tokens ({', '.join(map(str, counts))}) "
            f"but input_ids hold {found}")


class LlavaTarget(VLMTarget):
    """`LlavaForConditionalGeneration` and `LlavaNextForConditionalGeneration` (anyres tiles, `image_sizes`)."""

    model_input_names = ("pixel_values", "image_sizes")  # image_sizes: LLaVA-NeXT, or variable-size towers

    def __init__(self, model: nn.Module):
        super().__init__(model)
        self.anyres = isinstance(model, LlavaNextForConditionalGeneration)
        if self.anyres and model.config.vision_feature_select_strategy != "default":
            raise ValueError(f"target: {type(model).__name__} with vision_feature_select_strategy="
                             f"{model.config.vision_feature_select_strategy!r} cannot run: its anyres packing "
                             "(pack_image_features) needs the patch grid without the CLS token ('default')")
        tower = model.model.vision_tower
        self.sized_tower = "image_sizes" in inspect.signature(tower.forward).parameters  # e.g. Pixtral

    def fixed_image_size(self) -> tuple[int, int, int] | None:
        if self.sized_tower:
            return None
        return _square_size(self.model.config.vision_config)

    def _check_shapes(self, model_inputs: dict) -> None:
        pixels, sizes = model_inputs.get("pixel_values"), model_inputs.get("image_sizes")
        if not self.anyres:
            if sizes is not None and not self.sized_tower:
                raise ValueError(f"image_sizes: {type(self.model).__name__} with a "
                                 f"{type(self.model.model.vision_tower).__name__} tower takes no image_sizes "
                                 "(every image is resized to the tower's size)")
            return super()._check_shapes(model_inputs)
        if pixels is None:
            return
        self.check_pixel_size(pixels)
        if pixels.dim() not in (4, 5):
            raise ValueError(f"pixel_values: expected [images, tiles, channels, height, width] (or the tiles "
                             f"concatenated, 4-D), got shape {tuple(pixels.shape)}")
        if sizes is None:
            raise ValueError("image_sizes: required with pixel_values for LLaVA-NeXT (the processor returns it)")
        if sizes.dim() != 2 or sizes.shape[1] != 2:
            raise ValueError(f"image_sizes: expected [images, 2] (height, width), got shape {tuple(sizes.shape)}")
        if pixels.dim() == 5 and pixels.shape[0] != sizes.shape[0]:
            raise ValueError(f"image_sizes: {sizes.shape[0]} rows but pixel_values holds {pixels.shape[0]} images")

    def tokens_per_image(self, model_inputs: dict) -> list[int] | None:
        config = self.model.config
        if config.vision_feature_select_strategy != "default":
            return None
        if self.anyres:
            return [self._anyres_tokens(size) for size in model_inputs["image_sizes"].tolist()]
        if model_inputs.get("image_sizes") is not None:  # variable-size vision towers (e.g. Pixtral)
            return None
        tower = self.model.model.vision_tower
        positions = getattr(getattr(getattr(tower, "vision_model", tower), "embeddings", None), "num_positions", None)
        if positions is None:
            return None
        return [int(positions) - 1] * model_inputs["pixel_values"].shape[0]  # "default" drops the first token

    def _anyres_tokens(self, size: list[int]) -> int:
        """LLaVA-NeXT tokens of one image: base tile + the unpadded anyres grid with a newline per row."""
        vision = self.model.config.vision_config
        side = vision.image_size // vision.patch_size
        rows, cols = get_anyres_image_grid_shape(size, self.model.config.image_grid_pinpoints, vision.image_size)
        kept = unpad_image(torch.empty(0, rows * side, cols * side), size).shape  # [0, H', W']
        return side * side + kept[1] * (kept[2] + 1)


class Qwen2_5_VLTarget(VLMTarget):
    """`Qwen2_5_VLForConditionalGeneration`, and Qwen2-VL / Qwen3-VL: images and videos. M-RoPE positions come
    from the model's own `get_rope_index` (a video's time axis: its temporal patches, scaled by
    `second_per_grid_ts` on Qwen2.5-VL; Qwen3-VL gives each frame group its own span after a timestamp), one
    `rope_delta` per row ([B, 1]) shifting every later position on all three axes. Qwen3-VL's interleaved M-RoPE
    (in its rotary embedding) and DeepStack features (added inside the prefill forward at the image and video
    positions) need nothing more: later tokens are text."""

    model_input_names = ("pixel_values", "image_grid_thw", "mm_token_type_ids")
    video_input_names = ("pixel_values_videos", "video_grid_thw")
    token_types_name = "mm_token_type_ids"

    def __init__(self, model: nn.Module):
        super().__init__(model)
        if isinstance(model, Qwen2_5_VLForConditionalGeneration):  # seconds per temporal patch (M-RoPE time axis)
            self.video_input_names = (*self.video_input_names, "second_per_grid_ts")

    @property
    def family(self) -> str:
        return type(self.model).__name__.removesuffix("ForConditionalGeneration")

    def start(self, batch: int, needs: frozenset[str] = frozenset()) -> None:
        super().start(batch, needs)
        self.rope_deltas = torch.zeros(batch, 1, dtype=torch.long, device=self.device)  # [B, 1]

    def _check_shapes(self, model_inputs: dict) -> None:
        images = self._check_patches(model_inputs, "pixel_values", "image_grid_thw", "images")
        videos = self._check_patches(model_inputs, "pixel_values_videos", "video_grid_thw", "videos")
        seconds = model_inputs.get("second_per_grid_ts")
        if seconds is not None:
            if not videos:
                raise ValueError("second_per_grid_ts: given without pixel_values_videos")
            count = model_inputs["video_grid_thw"].shape[0]
            if tuple(seconds.shape) != (count,):
                raise ValueError(f"second_per_grid_ts: expected one value per video ({count}), got shape "
                                 f"{tuple(seconds.shape)}")
        if (images or videos) and model_inputs.get("mm_token_type_ids") is None:
            raise ValueError(f"mm_token_type_ids: required with pixel_values or pixel_values_videos for {self.family} "
                             "M-RoPE positions (the processor returns it)")

    def _check_patches(self, model_inputs: dict, pixels_name: str, grid_name: str, items: str) -> bool:
        """Flattened patches and their (t, h, w) grid must agree; True when the patches are given."""
        pixels, grid = model_inputs.get(pixels_name), model_inputs.get(grid_name)
        if pixels is None:
            if grid is not None:
                raise ValueError(f"{grid_name}: given without {pixels_name}")
            return False
        if pixels.dim() != 2:
            raise ValueError(f"{pixels_name}: expected flattened patches [patches, channels * patch volume] as the "
                             f"{self.family} processor returns them, got shape {tuple(pixels.shape)}")
        if grid is None:
            raise ValueError(f"{grid_name}: required with {pixels_name} for {self.family} (the processor returns it)")
        if grid.dim() != 2 or grid.shape[1] != 3:
            raise ValueError(f"{grid_name}: expected [{items}, 3] (t, h, w), got shape {tuple(grid.shape)}")
        if int(grid.prod(-1).sum()) != pixels.shape[0]:
            raise ValueError(f"{pixels_name}: {pixels.shape[0]} patches but {grid_name} describes "
                             f"{int(grid.prod(-1).sum())}")
        vision = self.model.config.vision_config
        channels = getattr(vision, "in_channels", None) or getattr(vision, "in_chans", 3)
        width = channels * vision.temporal_patch_size * vision.patch_size**2
        if pixels.shape[1] != width:
            raise ValueError(f"{pixels_name}: patches of {pixels.shape[1]} values, but the {self.family} vision tower "
                             f"takes {width} (channels {channels} x temporal {vision.temporal_patch_size} x "
                             f"{vision.patch_size}x{vision.patch_size} pixels)")
        merge = vision.spatial_merge_size
        if bool((grid[:, 1:] % merge).any()):
            raise ValueError(f"{grid_name}: heights and widths must be multiples of spatial_merge_size {merge} "
                             f"(got {grid.tolist()})")
        return True

    def tokens_per_image(self, model_inputs: dict) -> list[int] | None:
        merge = self.model.config.vision_config.spatial_merge_size
        return (model_inputs["image_grid_thw"].prod(-1) // merge**2).tolist()

    def tokens_per_video(self, model_inputs: dict) -> list[int]:
        merge = self.model.config.vision_config.spatial_merge_size
        return (model_inputs["video_grid_thw"].prod(-1) // merge**2).tolist()

    def prefill_positions(self, input_ids: Tensor, attention_mask: Tensor, model_inputs: dict) -> Tensor | None:
        """[3, B, L-1] M-RoPE positions of the prefix, computed on the full prompt (its last token is text);
        keeps each row's rope delta (last position + 1 - real length) for the positions of later tokens."""
        grids = {name: model_inputs[name].to(self.device) for name in ("image_grid_thw", "video_grid_thw",
                                                                       "second_per_grid_ts")
                 if model_inputs.get(name) is not None}
        if not grids:
            return None  # text only: 1-D positions on all axes, delta 0 (as HF generate)
        batch = input_ids.shape[0]
        ones = attention_mask.new_ones(batch, 1)
        positions, _ = self.model.model.get_rope_index(
            torch.cat([input_ids, input_ids.new_zeros(batch, 1)], 1),  # the last token's value is not read
            mm_token_type_ids=model_inputs["mm_token_type_ids"].to(self.device),
            attention_mask=torch.cat([attention_mask, ones], 1), **grids)
        # generate continues each row from its last prompt token's position (text: one value on all axes), + 1 per
        # token; that is the model's rope delta unless a video's time axis outruns its grid (more temporal patches
        # than grid rows, or Qwen2.5-VL's scaled time), whose delta `get_rope_index` takes from the video's maximum
        last = positions[0, :, -1].to(self.device, torch.long)  # [B]
        self.rope_deltas = (last - attention_mask.sum(1)).view(batch, 1)  # [B, 1]: position - (real length - 1)
        return positions[:, :, :-1]  # [3, B, L-1]

    def prefill_extras(self) -> dict:
        return {"rope_deltas": self.rope_deltas}

    @torch.no_grad()
    def verify(self, tree: DraftTree) -> TargetOutput:
        order = self.runner.cache.lengths[:, None] + tree.depth  # [B, T] token index of each node
        positions = (order + self.rope_deltas).expand(3, -1, -1)  # [3, B, T]
        out = self.runner.forward(positions, tree.ancestors, order, input_ids=tree.tokens)
        return TargetOutput(logits=out.logits, features=self.runner.captured)

    def select_rows(self, rows: Tensor) -> None:
        super().select_rows(rows)
        self.rope_deltas = self.rope_deltas[rows]


def _square_size(vision) -> tuple[int, int, int] | None:
    """(channels, side, side) of a vision config with one square input size; None when it says otherwise."""
    size, channels = getattr(vision, "image_size", None), getattr(vision, "num_channels", None)
    return (channels, size, size) if isinstance(size, int) and isinstance(channels, int) else None


def _check_padding(input_ids: Tensor, attention_mask: Tensor, token: int, kind: str) -> None:
    """Image (video) tokens under the attention mask's padding: the stock merge counts them, the mask does not."""
    padded = (input_ids == token) & ~attention_mask.bool()  # [B, L]
    if bool(padded.any()):
        rows = padded.any(1).nonzero().flatten().tolist()
        raise ValueError(f"input_ids: rows {rows} hold {kind} tokens (id {token}) where attention_mask is 0; pad "
                         "with the tokenizer's pad token")


SUPPORTED: dict[type, type[VLMTarget]] = {
    LlavaForConditionalGeneration: LlavaTarget,
    LlavaNextForConditionalGeneration: LlavaTarget,
    Qwen2_5_VLForConditionalGeneration: Qwen2_5_VLTarget,
}


def is_vision_language_model(model: Any) -> bool:
    """True for HF models whose config has a vision tower (the models this module adapts or rejects)."""
    return isinstance(model, nn.Module) and getattr(getattr(model, "config", None), "vision_config", None) is not None


def vlm_target(model: nn.Module) -> VLMTarget:
    """The adapter for a supported VLM; ValueError naming the supported classes otherwise."""
    for model_class, adapter in SUPPORTED.items():
        if isinstance(model, model_class):
            logger.debug("target: %s for %s", adapter.__name__, type(model).__name__)
            return adapter(model)
    names = ", ".join(c.__name__ for c in SUPPORTED)
    raise ValueError(f"target: {type(model).__name__} is not supported; supported: {names}")


register_target_adapter(is_vision_language_model, vlm_target)
