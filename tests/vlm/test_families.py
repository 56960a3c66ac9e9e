"""More VLM families (Gemma 3, ...): greedy tokens with untrained `eagle` and `vispec` drafters equal the stock
model's own greedy `generate` on a ragged batch of 3 prompts with different text, one of them holding two images."""

from __future__ import annotations

import functools

import pytest
import torch
from transformers import (
    Gemma3Config,
    Gemma3ForConditionalGeneration,
    Gemma3TextConfig,
    Idefics3Config,
    Idefics3ForConditionalGeneration,
    Idefics3VisionConfig,
    CLIPVisionConfig,
    InternVLConfig,
    InternVLForConditionalGeneration,
    InternVLVisionConfig,
    LlamaConfig,
    LlavaOnevisionConfig,
    LlavaOnevisionForConditionalGeneration,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
    SiglipVisionConfig,
    SmolVLMConfig,
    SmolVLMForConditionalGeneration,
    SmolVLMVisionConfig,
)

import specmm
import specmm.vlm
from specmm.core.target import FEATURES, as_target
from specmm.vlm import VisionDrafter
from tests.conftest import one_torch_thread, report_acceptance
from tests.vlm.test_targets import _CLIP, _TEXT, IMAGE, MAX_NEW, PAD, VOCAB, _finish, reference_setup

IMAGES_PER_ROW = [1, 2, 1]  # row 1 is a multi-image prompt
TEXT = [(3, 0, 4), (1, 2, 3), (6, 0, 2)]  # text tokens before, between and after each row's images
_SIGLIP = dict(image_size=32, patch_size=8, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
               num_attention_heads=2)


@pytest.fixture(autouse=True)
def one_thread():
    with one_torch_thread():
        yield


def family_prompts(tokens: list[list[int]], image: int = IMAGE, seed: int = 1, wrap: tuple[int, int] | None = None):
    """Left-padded rows `text, image, [text, image,] text`; tokens[b] lists the image tokens of row b's images,
    each span optionally wrapped in (start, end) marker tokens -> (input_ids [B, L], attention_mask [B, L])."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for (before, between, after), images in zip(TEXT, tokens):
        text = torch.randint(1, 80, (before + between + after,), generator=gen)
        pieces, cut = [text[:before]], [text[before:before + between], text[before + between:]]
        for i, n in enumerate(images):
            span = torch.full((n,), image)
            if wrap is not None:
                span = torch.cat([torch.tensor([wrap[0]]), span, torch.tensor([wrap[1]])])
            pieces += [span, cut[i] if i + 1 < len(images) else cut[1]]
        rows.append(torch.cat(pieces))
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), PAD)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row):], mask[i, width - len(row):] = row, 1
    return ids, mask


def _text(vocab: int) -> dict:
    return dict(_TEXT, vocab_size=vocab)


def _finish_decoder(model, seed: int):
    """`_finish` for models whose decoder is not `model.model.language_model`."""
    model.model.language_model = model.get_decoder()
    try:
        return _finish(model, seed)
    finally:
        del model.model.language_model


def tiny_gemma3(seed: int = 0, vocab: int = VOCAB, image: int = IMAGE, boi: int = 93, eoi: int = 94
                ) -> Gemma3ForConditionalGeneration:
    text = Gemma3TextConfig(**{k: v for k, v in _text(vocab).items() if k != "bos_token_id"}, head_dim=8,
                            sliding_window=12, layer_types=["sliding_attention", "full_attention"],
                            query_pre_attn_scalar=8, bos_token_id=None)
    config = Gemma3Config(text_config=text, vision_config=SiglipVisionConfig(**_SIGLIP), mm_tokens_per_image=4,
                          image_token_index=image, boi_token_index=boi, eoi_token_index=eoi)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return _finish(Gemma3ForConditionalGeneration(config), seed)


def gemma3_inputs(model) -> dict:
    gen = torch.Generator().manual_seed(2)
    ids, mask = family_prompts([[4] * n for n in IMAGES_PER_ROW], wrap=(93, 94))
    pixels = torch.randn(sum(IMAGES_PER_ROW), 3, 32, 32, generator=gen, dtype=torch.float64)
    return dict(input_ids=ids, attention_mask=mask, pixel_values=pixels, token_type_ids=(ids == IMAGE).long())


def tiny_idefics3(seed: int = 0, smolvlm: bool = False, vocab: int = VOCAB, image: int = IMAGE):
    """Idefics3 (or SmolVLM): 4x4 patches pixel-shuffled (scale 2) into 4 image tokens per image."""
    config_cls, vision_cls, model_cls = ((SmolVLMConfig, SmolVLMVisionConfig, SmolVLMForConditionalGeneration)
                                         if smolvlm else
                                         (Idefics3Config, Idefics3VisionConfig, Idefics3ForConditionalGeneration))
    config = config_cls(vision_config=vision_cls(**_SIGLIP), text_config=LlamaConfig(**_text(vocab)).to_dict(),
                        scale_factor=2, image_token_id=image)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return _finish_decoder(model_cls(config), seed)


def idefics3_inputs(model) -> dict:
    """Per-row pixel values [3, 2, C, H, W]: rows with one image carry an all-zero padding image."""
    gen = torch.Generator().manual_seed(2)
    ids, mask = family_prompts([[4] * n for n in IMAGES_PER_ROW], wrap=(93, 94))
    pixels = torch.randn(3, 2, 3, 32, 32, generator=gen, dtype=torch.float64)
    pixel_mask = torch.ones(3, 2, 32, 32, dtype=torch.long)
    for row, n in enumerate(IMAGES_PER_ROW):
        pixels[row, n:], pixel_mask[row, n:] = 0, 0
    return dict(input_ids=ids, attention_mask=mask, pixel_values=pixels, pixel_attention_mask=pixel_mask)


def tiny_llava_onevision(seed: int = 0, vocab: int = VOCAB, image: int = IMAGE
                         ) -> LlavaOnevisionForConditionalGeneration:
    """anyres_max_1: a tiled image's unpadded grid is shrunk bilinearly past one tile's worth of tokens."""
    config = LlavaOnevisionConfig(vision_config=CLIPVisionConfig(**_CLIP), text_config=LlamaConfig(**_text(vocab)),
                                  image_token_id=image, vision_feature_layer=-1, vision_aspect_ratio="anyres_max_1",
                                  vision_feature_select_strategy="default",
                                  image_grid_pinpoints=[[32, 32], [32, 64], [64, 32]])
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return _finish(LlavaOnevisionForConditionalGeneration(config), seed)


def llava_onevision_inputs(model) -> dict:
    """Tiled single images (wide and tall) and a two-image prompt whose images get one tile each."""
    gen = torch.Generator().manual_seed(2)
    sizes = torch.tensor([[20, 50], [40, 30], [32, 32], [60, 30]])
    pixels = torch.randn(4, 3, 3, 32, 32, generator=gen, dtype=torch.float64)
    per_prompt = torch.tensor(IMAGES_PER_ROW)
    with torch.no_grad():  # the stock model tells how many tokens each image fills
        features = model.model.get_image_features(pixels, sizes, batch_num_images=per_prompt).pooler_output
    counts = iter([f.shape[0] for f in features])
    ids, mask = family_prompts([[next(counts) for _ in range(n)] for n in IMAGES_PER_ROW])
    return dict(input_ids=ids, attention_mask=mask, pixel_values=pixels, image_sizes=sizes,
                batch_num_images=per_prompt)


_MROPE = {"rope_type": "default", "mrope_section": [2, 1, 1], "rope_theta": 10000.0}
_QWEN_IDS = dict(image_token_id=IMAGE, video_token_id=91, vision_start_token_id=92, vision_end_token_id=93)


def tiny_qwen2_vl(seed: int = 0, vocab: int = VOCAB, text: dict | None = None, **ids
                  ) -> Qwen2VLForConditionalGeneration:
    vision = dict(depth=1, embed_dim=16, hidden_size=32, num_heads=2, mlp_ratio=2, patch_size=4, spatial_merge_size=2,
                  temporal_patch_size=2)
    config = Qwen2VLConfig(text_config=dict(_text(vocab), rope_parameters=_MROPE, **(text or {})), vision_config=vision,
                           **{**_QWEN_IDS, **ids})
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return _finish(Qwen2VLForConditionalGeneration(config), seed)


def tiny_qwen3_vl(seed: int = 0, vocab: int = VOCAB, **ids) -> Qwen3VLForConditionalGeneration:
    """Interleaved M-RoPE; DeepStack features from both vision blocks added after the first two decoder layers."""
    text = dict(_text(vocab), head_dim=8, rope_parameters=dict(_MROPE, mrope_interleaved=True))
    vision = dict(depth=2, hidden_size=16, intermediate_size=32, num_heads=2, patch_size=4, spatial_merge_size=2,
                  temporal_patch_size=2, out_hidden_size=32, num_position_embeddings=16,
                  deepstack_visual_indexes=[0, 1])
    config = Qwen3VLConfig(text_config=text, vision_config=vision, **{**_QWEN_IDS, **ids})
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return _finish(Qwen3VLForConditionalGeneration(config), seed)


def qwen_vl_inputs(model) -> dict:
    """Non-square grids (per-row rope deltas differ); row 1 holds two images."""
    gen = torch.Generator().manual_seed(2)
    grid = torch.tensor([[1, 4, 6], [1, 6, 2], [1, 2, 4], [1, 4, 4]])
    counts = iter((grid.prod(-1) // 4).tolist())
    ids, mask = family_prompts([[next(counts) for _ in range(n)] for n in IMAGES_PER_ROW], wrap=(92, 93))
    pixels = torch.randn(int(grid.prod(-1).sum()), 3 * 2 * 4 * 4, generator=gen, dtype=torch.float64)
    return dict(input_ids=ids, attention_mask=mask, pixel_values=pixels, image_grid_thw=grid,
                mm_token_type_ids=(ids == IMAGE).int())


def tiny_internvl(seed: int = 0, vocab: int = VOCAB, image: int = IMAGE) -> InternVLForConditionalGeneration:
    """4x4 patches per tile, pixel-shuffled (ratio 0.5) into 4 image tokens; a Qwen2 decoder."""
    vision = InternVLVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                  image_size=32, patch_size=8)
    config = InternVLConfig(vision_config=vision, text_config=dict(_text(vocab), model_type="qwen2"),
                            image_token_id=image, image_seq_length=4, downsample_ratio=0.5)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return _finish(InternVLForConditionalGeneration(config), seed)


def internvl_inputs(model) -> dict:
    """Row 0's image has two tiles (one span of 8 tokens); row 1 holds two one-tile images."""
    gen = torch.Generator().manual_seed(2)
    ids, mask = family_prompts([[8], [4, 4], [4]], wrap=(92, 93))
    pixels = torch.randn(5, 3, 32, 32, generator=gen, dtype=torch.float64)
    return dict(input_ids=ids, attention_mask=mask, pixel_values=pixels)


FAMILIES = {"gemma3": (tiny_gemma3, gemma3_inputs),
            "idefics3": (tiny_idefics3, idefics3_inputs),
            "smolvlm": (functools.partial(tiny_idefics3, smolvlm=True), idefics3_inputs),
            "llava_onevision": (tiny_llava_onevision, llava_onevision_inputs),
            "qwen2_vl": (tiny_qwen2_vl, qwen_vl_inputs),
            "qwen3_vl": (tiny_qwen3_vl, qwen_vl_inputs),
            "internvl": (tiny_internvl, internvl_inputs)}
SPEC = specmm.TreeSpec.dynamic(depth=3, top_k=3, total_tokens=10)


@functools.cache
def setup(family: str):
    """(model, inputs, eos, reference sequences of the stock model's greedy generate)."""
    return reference_setup(*FAMILIES[family])


COMPRESSING = ("vispec", "dream", "flash")  # learned-query pooling, attention top-k pruning, latent pooling
CASES = [(family, method) for family in FAMILIES for method in ("eagle", *COMPRESSING)
         if family != "smolvlm" or method in ("eagle", "vispec")]  # SmolVLM shares the Idefics3 adapter


@pytest.mark.parametrize("family, method", CASES)
def test_greedy_tokens_equal_stock_generate(family, method):
    model, inputs, eos, reference = setup(family)
    torch.manual_seed(0)
    drafter = VisionDrafter.for_target(model, method=method, **({"num_latents": 2} if method == "flash" else {}))
    out = specmm.SpeculativeGenerator(model, drafter, tree=SPEC).generate(
        **inputs, max_new_tokens=MAX_NEW, eos_token_id=eos, pad_token_id=PAD)
    report_acceptance(f"vlm/{family}/{method}", out.stats)
    assert torch.equal(out.sequences, reference)
    assert drafter.image_tokens == int((inputs["input_ids"] == model.config.image_token_id).sum())
    if method == "vispec":  # one compressed token per image span
        assert drafter.visual_tokens_seen == sum(IMAGES_PER_ROW)
    elif method in ("dream", "flash"):  # pruned / pooled image spans
        assert drafter.visual_tokens_seen < drafter.image_tokens
    stopped = [(row[inputs["input_ids"].shape[1]:] == eos).any().item() for row in reference]
    assert any(stopped) and not all(stopped), "EOS must end some rows and not others"


def test_sliding_windows_count_tokens_not_mrope_positions():
    """HF windows by token order; an image's M-RoPE positions advance less than its tokens (a 4x6 grid: 6 tokens,
    3 positions), so a window measured in positions would see further back than `generate` does."""
    sliding = dict(use_sliding_window=True, sliding_window=4, max_window_layers=1,
                   layer_types=["full_attention", "sliding_attention"])
    model, inputs, eos, reference = reference_setup(functools.partial(tiny_qwen2_vl, text=sliding), qwen_vl_inputs)
    drafter = specmm.drafters.PromptLookupDrafter(ngram=1, k=3)
    out = specmm.SpeculativeGenerator(model, drafter, tree=specmm.TreeSpec.chain(3)).generate(
        **inputs, max_new_tokens=MAX_NEW, eos_token_id=eos, pad_token_id=PAD)
    assert torch.equal(out.sequences, reference)


def assert_prefill_features_equal_stock(model, inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's prefill of the prompt minus its last token gives the stock forward's last hidden states there;
    returns those states [B, L-1, d] and where they are valid [B, L-1]."""
    target = as_target(model)
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    extra = {k: v for k, v in inputs.items() if k not in ("input_ids", "attention_mask")}
    target.start(ids.shape[0], needs=frozenset({FEATURES}))
    try:
        out = target.prefill(ids[:, :-1], mask[:, :-1], **extra)
    finally:
        target.close()
    with torch.no_grad():
        stock = model.model(**inputs).last_hidden_state[:, :-1]
    valid = mask[:, :-1].bool()
    torch.testing.assert_close(out.features[valid], stock[valid], atol=1e-6, rtol=0)
    return stock, valid


@pytest.mark.parametrize("family", list(FAMILIES))
def test_prefill_features_equal_stock_forward(family):
    """The prompt prefill (mask and positions) gives the stock forward's last hidden states at every prompt token."""
    model, inputs, _, _ = setup(family)
    stock, valid = assert_prefill_features_equal_stock(model, inputs)
    if family == "gemma3":  # the check can fail: a causal image prefill gives other features
        with torch.no_grad():
            causal = model.model(**{k: v for k, v in inputs.items() if k != "token_type_ids"}).last_hidden_state
        assert (causal[:, :-1][valid] - stock[valid]).abs().max() > 1e-3


def _without_last_image(inputs: dict) -> dict:
    """Idefics3 inputs whose two-image row lost its second image (a padding image instead)."""
    pixels = inputs["pixel_values"].clone()
    pixels[1, 1] = 0
    return dict(inputs, pixel_values=pixels)


BAD_INPUTS = {
    "gemma3/token types": ("gemma3", lambda i: dict(i, token_type_ids=torch.zeros_like(i["token_type_ids"])),
                           "token_type_ids: does not mark exactly the image tokens"),
    "gemma3/fewer images": ("gemma3", lambda i: dict(i, pixel_values=i["pixel_values"][:3]),
                            "pixel_values: 3 images but input_ids hold image tokens for 4"),
    "idefics3/flat pixels": ("idefics3", lambda i: dict(i, pixel_values=i["pixel_values"][:, 0]),
                             r"pixel_values: expected \[prompts, images, channels, height, width\]"),
    "idefics3/rows": ("idefics3", lambda i: dict(i, pixel_values=i["pixel_values"][:2],
                                                 pixel_attention_mask=i["pixel_attention_mask"][:2]),
                      "pixel_values: 2 prompt rows but input_ids has 3"),
    "idefics3/padding image": ("idefics3", _without_last_image, "pixel_values: 3 images but input_ids hold image "
                                                                "tokens for 4"),
    "llava_onevision/batch_num_images": ("llava_onevision", lambda i: dict(i, batch_num_images=torch.tensor([1, 1, 1])),
                                         "batch_num_images: counts 3 images but image_sizes has 4 rows"),
    "gemma3/video": ("gemma3", lambda i: dict(i, pixel_values_videos=torch.ones(1, 2, 3, 32, 32)),
                     "pixel_values_videos: not an input of Gemma3Target .* takes no videos"),
    "gemma3/image size": ("gemma3", lambda i: dict(i, pixel_values=i["pixel_values"][..., :24, :24]),
                          r"images of \[channels, height, width\] \[3, 24, 24\], but .* tower takes \[3, 32, 32\]"),
    "internvl/fewer tiles": ("internvl", lambda i: dict(i, pixel_values=i["pixel_values"][:4]),
                             "pixel_values: 4 images but input_ids hold image tokens for 5"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_image_inputs_raise_before_any_forward(case):
    family, change, message = BAD_INPUTS[case]
    model, inputs, _, _ = setup(family)
    calls = [0]
    hook = model.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    try:
        gen = specmm.SpeculativeGenerator(model, specmm.drafters.PromptLookupDrafter(), tree=specmm.TreeSpec.chain(2))
        with pytest.raises(ValueError, match=message):
            gen.generate(**change(inputs), max_new_tokens=2)
    finally:
        hook.remove()
    assert calls[0] == 0, "the error must come before any forward"


def test_fully_bidirectional_gemma3_is_refused():
    model, _, _, _ = setup("gemma3")
    text = model.config.get_text_config()
    text.use_bidirectional_attention = True
    try:
        with pytest.raises(ValueError, match="use_bidirectional_attention"):
            as_target(model)
    finally:
        text.use_bidirectional_attention = False
