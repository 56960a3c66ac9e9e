"""VLM targets: speculative tokens equal the stock model's own greedy `generate`, image inputs are checked
before any work, and unsupported VLM classes are refused."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn
from transformers import (
    CLIPVisionConfig,
    LlamaConfig,
    LlamaForCausalLM,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaNextConfig,
    LlavaNextForConditionalGeneration,
    PaliGemmaConfig,
    PaliGemmaForConditionalGeneration,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2Config,
    Qwen2ForCausalLM,
    SiglipVisionConfig,
)

import specmm
import specmm.vlm
from specmm.core.target import FEATURES, INPUTS_EMBEDS, as_target
from specmm.drafters import EagleDrafter, ModelDrafter
from specmm.vlm import LlavaTarget, Qwen2_5_VLTarget
from tests.conftest import one_torch_thread, report_acceptance

VOCAB, PAD, IMAGE = 96, 0, 95
MAX_NEW = 16
_TEXT = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512, bos_token_id=None, eos_token_id=None, pad_token_id=PAD)
_CLIP = dict(image_size=32, patch_size=8, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
             num_attention_heads=2)
PROMPTS = [(3, 4), (1, 7), (6, 2)]  # text tokens before / after each row's image: different lengths


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models gain nothing from intra-op threads, and on a 2-core machine shared with other jobs the
    threads spin-wait on each other (50x slower); the previous setting is restored afterwards."""
    with one_torch_thread():
        yield


def _finish(model: nn.Module, seed: int) -> nn.Module:
    model = model.to(torch.float64).eval()
    torch.manual_seed(seed)
    with torch.no_grad():
        model.get_output_embeddings().weight.normal_(0, 0.5)  # sharp next-token distributions: no near-ties
        for name, weight in model.model.language_model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):  # peaked attention: positions matter
                weight.normal_(0, 0.3)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = PAD
    return model


def tiny_llava(seed: int = 0) -> LlavaForConditionalGeneration:
    config = LlavaConfig(vision_config=CLIPVisionConfig(**_CLIP), text_config=LlamaConfig(**_TEXT),
                         image_token_id=IMAGE, vision_feature_layer=-1)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return _finish(LlavaForConditionalGeneration(config), seed)


def tiny_llava_next(seed: int = 0) -> LlavaNextForConditionalGeneration:
    config = LlavaNextConfig(vision_config=CLIPVisionConfig(**_CLIP), text_config=LlamaConfig(**_TEXT),
                             image_token_id=IMAGE, vision_feature_layer=-1,
                             image_grid_pinpoints=[[32, 32], [32, 64], [64, 32]])
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return _finish(LlavaNextForConditionalGeneration(config), seed)


def tiny_qwen2_5_vl(seed: int = 0) -> Qwen2_5_VLForConditionalGeneration:
    text = dict(_TEXT, rope_parameters={"rope_type": "default", "mrope_section": [2, 1, 1], "rope_theta": 10000.0})
    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, patch_size=4, spatial_merge_size=2,
                  temporal_patch_size=2, window_size=16, out_hidden_size=32, fullatt_block_indexes=[0])
    config = Qwen2_5_VLConfig(text_config=text, vision_config=vision, image_token_id=IMAGE, video_token_id=94,
                              vision_start_token_id=92, vision_end_token_id=93)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return _finish(Qwen2_5_VLForConditionalGeneration(config), seed)


def _prompts(image_tokens: list[int], seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded rows `text, image tokens, text` -> (input_ids [B, L], attention_mask [B, L])."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for (before, after), n in zip(PROMPTS, image_tokens):
        text = torch.randint(1, 90, (before + after,), generator=gen)
        rows.append(torch.cat([text[:before], torch.full((n,), IMAGE), text[before:]]))
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), PAD)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row):], mask[i, width - len(row):] = row, 1
    return ids, mask


def llava_inputs(model) -> dict:
    gen = torch.Generator().manual_seed(2)
    ids, mask = _prompts([16] * 3)  # (32 / 8)^2 patches, the CLS token dropped
    return dict(input_ids=ids, attention_mask=mask,
                pixel_values=torch.randn(3, 3, 32, 32, generator=gen, dtype=torch.float64))


def llava_next_inputs(model) -> dict:
    gen = torch.Generator().manual_seed(2)
    sizes = torch.tensor([[20, 50], [40, 30], [32, 32]])  # (height, width): wide, tall and square images
    pixels = torch.randn(3, 3, 3, 32, 32, generator=gen, dtype=torch.float64)  # base tile + 2 grid tiles
    with torch.no_grad():  # the stock model tells how many tokens each image fills
        features = model.model.get_image_features(pixels, sizes).pooler_output
    ids, mask = _prompts([f.shape[0] for f in features])
    return dict(input_ids=ids, attention_mask=mask, pixel_values=pixels, image_sizes=sizes)


def qwen_inputs(model) -> dict:
    gen = torch.Generator().manual_seed(2)
    grid = torch.tensor([[1, 4, 6], [1, 6, 2], [1, 4, 4]])  # non-square grids: rope deltas differ per row
    ids, mask = _prompts((grid.prod(-1) // 4).tolist())
    pixels = torch.randn(int(grid.prod(-1).sum()), 3 * 2 * 4 * 4, generator=gen, dtype=torch.float64)
    return dict(input_ids=ids, attention_mask=mask, pixel_values=pixels, image_grid_thw=grid,
                mm_token_type_ids=(ids == IMAGE).int())


def text_lm_copy(model) -> nn.Module:
    """A text-only causal LM with the VLM's decoder weights: a draft model with the same vocabulary that
    agrees with the target often but not always (it sees image tokens as plain embeddings)."""
    config = model.config.get_text_config().to_dict()
    qwen = isinstance(model, Qwen2_5_VLForConditionalGeneration)
    config_cls, model_cls = (Qwen2Config, Qwen2ForCausalLM) if qwen else (LlamaConfig, LlamaForCausalLM)
    config = config_cls(**{k: v for k, v in config.items() if k not in ("model_type", "architectures")})
    config._attn_implementation = "sdpa"
    lm = model_cls(config).to(torch.float64).eval()
    state = {"model." + k: v for k, v in model.model.language_model.state_dict().items()}
    lm.load_state_dict({**state, "lm_head.weight": model.lm_head.weight})
    return lm


FAMILIES = {"llava": (tiny_llava, llava_inputs, LlavaTarget),
            "llava_next": (tiny_llava_next, llava_next_inputs, LlavaTarget),
            "qwen2_5_vl": (tiny_qwen2_5_vl, qwen_inputs, Qwen2_5_VLTarget)}
SPECS = {"chain3": specmm.TreeSpec.chain(3), "dynamic": specmm.TreeSpec.dynamic(depth=4, top_k=3, total_tokens=12)}


def _pick_eos(new_tokens: torch.Tensor) -> int:
    """A token some rows produce early and at least one row never produces."""
    rows = [set(r.tolist()) for r in new_tokens]
    for token in sorted(set().union(*(set(r[: MAX_NEW // 2].tolist()) for r in new_tokens))):
        if token not in (PAD, IMAGE) and 0 < sum(token in r for r in rows) < len(rows):
            return token
    raise AssertionError("no token separates the rows; change the prompts")


@functools.cache
def setup(family: str):
    """(model, inputs, eos, reference sequences of the stock model's greedy generate)."""
    build, make_inputs, _ = FAMILIES[family]
    return reference_setup(build, make_inputs)


def reference_setup(build, make_inputs):
    """Build a tiny model and its inputs, pick an EOS that stops rows at different steps, and return
    (model, inputs, eos, the stock model's greedy generate with that EOS)."""
    model = build()
    inputs = make_inputs(model)
    free = model.generate(**inputs, do_sample=False, max_new_tokens=MAX_NEW)
    eos = _pick_eos(free[:, inputs["input_ids"].shape[1]:])
    reference = model.generate(**inputs, do_sample=False, max_new_tokens=MAX_NEW, eos_token_id=eos,
                               pad_token_id=PAD)
    return model, inputs, eos, reference


@pytest.mark.parametrize("spec_name", list(SPECS))
@pytest.mark.parametrize("family", list(FAMILIES))
def test_greedy_eagle_tokens_equal_stock_generate(family, spec_name):
    model, inputs, eos, reference = setup(family)
    torch.manual_seed(0)
    gen = specmm.SpeculativeGenerator(model, EagleDrafter.for_target(model), tree=SPECS[spec_name])
    out = gen.generate(**inputs, max_new_tokens=MAX_NEW, eos_token_id=eos, pad_token_id=PAD)
    report_acceptance(f"{family}/eagle-untrained/{spec_name}", out.stats)
    assert torch.equal(out.sequences, reference)
    stopped = [(row[inputs["input_ids"].shape[1]:] == eos).any().item() for row in reference]
    assert any(stopped) and not all(stopped), "EOS must end some rows and not others"


@pytest.mark.parametrize("spec_name", list(SPECS))
@pytest.mark.parametrize("family", list(FAMILIES))
def test_greedy_model_drafter_tokens_equal_stock_generate_with_deep_acceptance(family, spec_name):
    """Drafts accepted at every depth check the verify positions (M-RoPE deltas included) past the root."""
    model, inputs, eos, reference = setup(family)
    gen = specmm.SpeculativeGenerator(model, ModelDrafter(text_lm_copy(model)), tree=SPECS[spec_name])
    out = gen.generate(**inputs, max_new_tokens=MAX_NEW, eos_token_id=eos, pad_token_id=PAD)
    report_acceptance(f"{family}/text-copy/{spec_name}", out.stats)
    assert torch.equal(out.sequences, reference)
    assert sum(out.stats.accepted_histogram[2:]) > 0, "drafts must be accepted past depth 1"


@pytest.mark.parametrize("family", list(FAMILIES))
def test_prefill_returns_stock_features_merged_embeddings_and_image_mask(family):
    model, inputs, _, _ = setup(family)
    target = as_target(model)
    assert isinstance(target, FAMILIES[family][2])
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    extra = {k: v for k, v in inputs.items() if k not in ("input_ids", "attention_mask")}
    target.start(ids.shape[0], needs=frozenset({FEATURES, INPUTS_EMBEDS}))
    try:
        out = target.prefill(ids[:, :-1], mask[:, :-1], **extra)
    finally:
        target.close()
    with torch.no_grad():  # the stock forward over the whole prompt; the prefix rows must agree
        stock = model.model(**inputs)
        embeds = model.model.get_input_embeddings()(ids)
        image_rows = ids == IMAGE
        features = torch.cat(model.get_image_features(**{k: v for k, v in extra.items() if k != "mm_token_type_ids"})
                             .pooler_output)
        embeds[image_rows] = features
    valid = mask[:, :-1].bool()
    assert out.features.shape == out.inputs_embeds.shape == (*ids[:, :-1].shape, 32)
    assert torch.equal(out.extras["image_mask"], image_rows[:, :-1])
    assert torch.allclose(out.inputs_embeds[valid], embeds[:, :-1][valid])
    assert torch.allclose(out.features[valid], stock.last_hidden_state[:, :-1][valid],
                          atol=1e-6)  # norms run in float32
    if family == "qwen2_5_vl":
        deltas = out.extras["rope_deltas"]
        assert deltas.shape == (3, 1) and len(set(deltas.flatten().tolist())) > 1  # per-row M-RoPE deltas


def test_prefill_without_needs_returns_no_embeddings():
    model, inputs, _, _ = setup("llava")
    target = as_target(model)
    target.start(3)
    try:
        out = target.prefill(inputs["input_ids"][:, :-1], inputs["attention_mask"][:, :-1],
                             pixel_values=inputs["pixel_values"])
    finally:
        target.close()
    assert out.features is None and out.inputs_embeds is None and out.extras["image_mask"].any()


def test_real_llava_processor_and_trained_captioner_equal_stock_generate():
    """The zoo captioner: real LlavaProcessor outputs (left padding), a trained target and its draft LM."""
    from specmm import zoo
    from specmm.zoo import captioner, scenes

    try:
        path = zoo.path("captioner", "cpu")
    except FileNotFoundError:
        pytest.skip("zoo captioner (cpu) is not built")
    models = captioner.load(path, dtype=torch.float64)
    images = [scenes.render(captioner.scene_and_caption(seed)[0], models.image_size, seed=seed) for seed in (1, 2, 3)]
    prompts = [captioner.PROMPT, "<image>\nDescribe.\n", "<image>\nDescribe the picture in detail, please.\n"]
    inputs = models.processor(images=images, text=prompts, return_tensors="pt", padding=True, padding_side="left")
    assert not inputs["attention_mask"].all(), "prompts of different lengths must be left-padded"
    eos = models.processor.tokenizer.eos_token_id
    reference = models.target.generate(**inputs, do_sample=False, max_new_tokens=24, eos_token_id=eos,
                                       pad_token_id=models.processor.tokenizer.pad_token_id)
    gen = specmm.SpeculativeGenerator(models.target, ModelDrafter(models.draft), tree=SPECS["dynamic"])
    out = gen.generate(**inputs, max_new_tokens=24, eos_token_id=eos,
                       pad_token_id=models.processor.tokenizer.pad_token_id)
    report_acceptance("zoo-captioner/draft-lm/dynamic", out.stats)
    assert torch.equal(out.sequences, reference)
    assert out.stats.mean_accepted > 1.5


# ------------------------------------------------------------------------------------------ input errors


def _forward_counter(model) -> list[int]:
    calls = [0]
    model.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def _generate(family: str, forwards_before_error: int = 0, **changes):
    """Run a fresh model of `family` on its inputs with `changes` (None deletes); the error must come after
    exactly `forwards_before_error` target forwards."""
    build, make_inputs, _ = FAMILIES[family]
    model = build()
    inputs = make_inputs(model)
    for key, value in changes.items():
        if value is None:
            inputs.pop(key)
        else:
            inputs[key] = value(inputs) if callable(value) else value
    calls = _forward_counter(model)
    gen = specmm.SpeculativeGenerator(model, specmm.drafters.PromptLookupDrafter(), tree=specmm.TreeSpec.chain(2))
    try:
        gen.generate(**inputs, max_new_tokens=2)
    finally:
        assert calls[0] == forwards_before_error, "the error must come before any forward"


def _image_at_end(inputs):
    """Each row's text moved before its image: pads, text, then the image tokens."""
    ids = inputs["input_ids"]
    order = torch.sort(inputs["attention_mask"] + (ids == IMAGE).long(), dim=1, stable=True).indices
    return ids.gather(1, order)


def _extra_image_token_at_end(inputs):
    return torch.cat([inputs["input_ids"][:, 1:], torch.full((3, 1), IMAGE)], 1)


def _drop_image_tokens(inputs):
    return inputs["input_ids"].masked_fill(inputs["input_ids"] == IMAGE, 7)


BAD_INPUTS = {
    "llava/fewer images": ("llava", dict(pixel_values=lambda i: i["pixel_values"][:2]),
                           "pixel_values: 2 images but input_ids hold image tokens for 3"),
    "llava/image token last": ("llava", dict(input_ids=_image_at_end), r"last prompt token of row\(s\) \[0, 1, 2\]"),
    "llava/no image tokens": ("llava", dict(input_ids=_drop_image_tokens), "pixel_values: given but input_ids hold no"),
    "llava/no pixels": ("llava", dict(pixel_values=None), "input_ids: hold 48 image tokens"),
    "llava/unknown input": ("llava", dict(image_grid_thw=torch.ones(3, 3)), "image_grid_thw: not an input of"),
    "llava/not a tensor": ("llava", dict(pixel_values=[1.0]), "pixel_values: expected a tensor"),
    "llava_next/no image_sizes": ("llava_next", dict(image_sizes=None), "image_sizes: required"),
    "llava_next/wrong sizes": ("llava_next", dict(image_sizes=lambda i: i["image_sizes"].flip(1)),
                               "pixel_values: 3 images need"),
    "qwen/fewer images": ("qwen2_5_vl", dict(pixel_values=lambda i: i["pixel_values"][:36],
                                             image_grid_thw=lambda i: i["image_grid_thw"][:2]),
                          "pixel_values: 2 images but input_ids hold image tokens for 3"),
    "qwen/grid mismatch": ("qwen2_5_vl", dict(image_grid_thw=lambda i: i["image_grid_thw"] * 2),
                           "pixel_values: 52 patches but image_grid_thw describes 416"),
    "qwen/no token types": ("qwen2_5_vl", dict(mm_token_type_ids=None), "mm_token_type_ids: required"),
    "qwen/image token last": ("qwen2_5_vl", dict(mm_token_type_ids=lambda i: torch.cat(
        [i["mm_token_type_ids"][:, :-1], torch.ones(3, 1, dtype=torch.int)], 1)), "last prompt token of row"),
    "qwen/video without grid": ("qwen2_5_vl", dict(pixel_values_videos=torch.ones(2, 2)),
                                "video_grid_thw: required with pixel_values_videos"),
    "llava/video": ("llava", dict(pixel_values_videos=torch.ones(1, 2, 3, 32, 32)),
                    "pixel_values_videos: not an input of LlavaTarget .* takes no videos"),
    "llava/image size": ("llava", dict(pixel_values=lambda i: i["pixel_values"].repeat(1, 1, 2, 2)),
                         r"images of \[channels, height, width\] \[3, 64, 64\], but .* tower takes \[3, 32, 32\]"),
    "llava/sizes for a fixed tower": ("llava", dict(image_sizes=torch.full((3, 2), 32)),
                                      "image_sizes: LlavaForConditionalGeneration with a CLIPVisionModel tower"),
    "qwen/patch width": ("qwen2_5_vl", dict(pixel_values=lambda i: i["pixel_values"][:, :-1]),
                         r"pixel_values: patches of 95 values, but the Qwen2_5_VL vision tower takes 96"),
    "qwen/grid not merged": ("qwen2_5_vl", dict(image_grid_thw=torch.tensor([[1, 3, 8], [1, 6, 2], [1, 4, 4]])),
                             "image_grid_thw: heights and widths must be multiples of spatial_merge_size 2"),
    "qwen/images out of order": ("qwen2_5_vl", dict(image_grid_thw=torch.tensor([[1, 6, 2], [1, 4, 6], [1, 4, 4]])),
                                 r"fill \[3, 6, 4\] tokens in order, but the image-token spans .* hold \[6, 3, 4\]"),
    "qwen/image token in padding": ("qwen2_5_vl", dict(input_ids=lambda i: i["input_ids"].index_fill(1, torch.tensor(
        [0]), IMAGE)), r"input_ids: rows \[1, 2\] hold image tokens \(id 95\) where attention_mask is 0"),
}


def test_llava_next_keeping_the_cls_token_is_refused():
    """HF's anyres packing cannot take the CLS token ('full' strategy): refuse it when the target is made."""
    model = tiny_llava_next()
    model.config.vision_feature_select_strategy = "full"
    with pytest.raises(ValueError, match="vision_feature_select_strategy='full' cannot run"):
        as_target(model)


def test_image_token_root_raises_at_first_verify():
    """A prompt ending in one image token more than the images fill: the prefix counts agree, the root does not."""
    with pytest.raises(ValueError, match=r"last prompt token of row\(s\) \[0, 1, 2\] is an image token"):
        _generate("llava", forwards_before_error=1, input_ids=_extra_image_token_at_end)  # after the prefill


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_image_inputs_raise_before_any_forward(case):
    family, changes, message = BAD_INPUTS[case]
    with pytest.raises(ValueError, match=message):
        _generate(family, **changes)


def test_unsupported_vlm_class_is_refused():
    vision = SiglipVisionConfig(image_size=32, patch_size=8, hidden_size=16, intermediate_size=32,
                                num_hidden_layers=1, num_attention_heads=2)
    text = dict(_TEXT, model_type="gemma", head_dim=8)
    model = PaliGemmaForConditionalGeneration(PaliGemmaConfig(vision_config=vision, text_config=text))
    with pytest.raises(ValueError, match="target: PaliGemmaForConditionalGeneration is not supported; supported: "
                                         "LlavaForConditionalGeneration") as refused:
        as_target(model)
    for supported in ("LlavaNext", "Qwen2_5_VL", "Gemma3", "Idefics3", "SmolVLM", "LlavaOnevision", "Qwen2VL",
                      "Qwen3VL", "InternVL"):
        assert f"{supported}ForConditionalGeneration" in str(refused.value)
    with pytest.raises(ValueError, match="is not supported"):
        specmm.SpeculativeGenerator(model, specmm.drafters.PromptLookupDrafter())
