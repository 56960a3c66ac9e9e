"""Sampling is exact in law on the new VLM families: with a vispec drafter, the joint distribution of the first two
new tokens (vocabulary 8, one image per prompt) equals the target's own processed distribution, by chi-square.
One family per image layout: Gemma 3, Idefics3 (SmolVLM shares its adapter), LLaVA-OneVision, Qwen3-VL (Qwen2-VL
shares its adapter with Qwen2.5-VL) and InternVL."""

from __future__ import annotations

import pytest
import torch

import specmm
from specmm.core.sampling import process_logits
from specmm.vlm import VisionDrafter
from tests.core.test_engine_sampling import assert_matches
from tests.vlm import test_families as families
from tests.vlm.test_targets import one_thread  # noqa: F401  (autouse fixture)

VOCAB, IMAGE = 8, 7
SAMPLES, CHUNK = 4_000, 2_000
SAMPLING = specmm.SamplingConfig(temperature=0.8, top_k=3)
TOKEN_TYPES = ("token_type_ids", "mm_token_type_ids")
DRAFTER_SEEDS = {"idefics3": 3, "llava_onevision": 5, "qwen3_vl": 5}  # untrained heads the target accepts now and then


def _prompt(image_tokens: int) -> torch.Tensor:
    return torch.tensor([[3, *[IMAGE] * image_tokens, 1, 5]])


def family_case(family: str):
    """(model, one-row inputs): the family's tiny model over 8 tokens and one image; one group per layout."""
    gen = torch.Generator().manual_seed(1)
    if family == "gemma3":  # bidirectional image block
        model = families.tiny_gemma3(vocab=VOCAB, image=IMAGE, boi=5, eoi=6)
        ids = _prompt(4)
        inputs = dict(pixel_values=torch.randn(1, 3, 32, 32, generator=gen), token_type_ids=(ids == IMAGE).long())
    elif family == "idefics3":  # per-row pixel values, pixel-shuffled tokens
        model = families.tiny_idefics3(vocab=VOCAB, image=IMAGE)
        ids = _prompt(4)
        inputs = dict(pixel_values=torch.randn(1, 1, 3, 32, 32, generator=gen))
    elif family == "llava_onevision":  # anyres tiles of a wide image, unpadded and shrunk (anyres_max_1)
        model = families.tiny_llava_onevision(vocab=VOCAB, image=IMAGE)
        inputs = dict(pixel_values=torch.randn(1, 3, 3, 32, 32, generator=gen), image_sizes=torch.tensor([[20, 50]]))
        with torch.no_grad():  # the stock model tells how many tokens the image fills
            features = model.model.get_image_features(inputs["pixel_values"].double(), inputs["image_sizes"])
        ids = _prompt(features.pooler_output[0].shape[0])
    elif family == "internvl":  # flat tiles, one image's two tiles in one span of pixel-shuffled tokens
        model = families.tiny_internvl(vocab=VOCAB, image=IMAGE)
        ids = _prompt(8)
        inputs = dict(pixel_values=torch.randn(2, 3, 32, 32, generator=gen))
    else:  # qwen3_vl: interleaved M-RoPE with per-row deltas and DeepStack
        model = families.tiny_qwen3_vl(vocab=VOCAB, image_token_id=IMAGE, video_token_id=6, vision_start_token_id=5,
                                       vision_end_token_id=4)
        ids = _prompt(6)
        inputs = dict(pixel_values=torch.randn(24, 96, generator=gen), image_grid_thw=torch.tensor([[1, 4, 6]]),
                      mm_token_type_ids=(ids == IMAGE).int())
    model = model.to(torch.float32)
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        # logits of a few units: spread distributions
        head.normal_(0, 0.05 if family in ("gemma3", "internvl") else 0.3)
        head[IMAGE] = -head[:IMAGE].mean(0) * 4  # the image token (almost) never sampled
    return model, dict(input_ids=ids, attention_mask=torch.ones_like(ids), **inputs)


def _rows(inputs: dict, n: int) -> dict:
    """A one-row input batch repeated n times (flat per-image tensors repeat along their first axis as well)."""
    return {k: v.repeat(n, *[1] * (v.dim() - 1)) for k, v in inputs.items()}


def _appended(inputs: dict, tokens: torch.Tensor) -> dict:
    """Row i of the repeated inputs continued by tokens[i] (a text token)."""
    out = _rows(inputs, len(tokens))
    out["input_ids"] = torch.cat([out["input_ids"], tokens[:, None]], 1)
    out["attention_mask"] = torch.cat([out["attention_mask"], torch.ones_like(tokens)[:, None]], 1)
    for key in TOKEN_TYPES:
        if key in out:
            out[key] = torch.cat([out[key], torch.zeros_like(out[key][:, :1])], 1)
    return out


@pytest.mark.parametrize("family", ["gemma3", "idefics3", "llava_onevision", "qwen3_vl", "internvl"])
def test_sampled_vispec_joint_distribution_matches_target(family):
    model, inputs = family_case(family)
    with torch.no_grad():
        first = process_logits(model(**inputs).logits[0, -1].double(), SAMPLING)  # [V]
        assert first[IMAGE] == 0, "the reference below cannot append an image token"
        text = torch.arange(VOCAB - 1)
        second = torch.zeros(VOCAB, VOCAB, dtype=torch.float64)
        second[:VOCAB - 1] = process_logits(model(**_appended(inputs, text)).logits[:, -1].double(), SAMPLING)
    joint = first[:, None] * second

    torch.manual_seed(DRAFTER_SEEDS.get(family, 0))
    drafter = VisionDrafter.for_target(model, method="vispec")
    gen = specmm.SpeculativeGenerator(model, drafter, tree=specmm.TreeSpec.dynamic(depth=2, top_k=2, total_tokens=4))
    generator = torch.Generator().manual_seed(5)
    counts = torch.zeros(VOCAB * VOCAB, dtype=torch.long)
    accepted = 0
    for _ in range(SAMPLES // CHUNK):
        out = gen.generate(**_rows(inputs, CHUNK), max_new_tokens=2, sampling=SAMPLING, generator=generator,
                           eos_token_id=[])
        new = out.sequences[:, inputs["input_ids"].shape[1]:]
        counts += torch.bincount(new[:, 0] * VOCAB + new[:, 1], minlength=VOCAB * VOCAB)
        accepted += sum(out.stats.accepted_histogram[1:])
    assert accepted > 0, "some drafts must be accepted for the test to say anything"
    assert_matches(counts, joint)
