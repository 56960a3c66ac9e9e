"""Sampling with a VisionDrafter is exact in law: the joint distribution of the first two new tokens of a tiny
LLaVA (vocabulary 8) equals the target's own processed distribution, by a chi-square test."""

from __future__ import annotations

import torch
from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

import specmm
from specmm.core.sampling import process_logits
from specmm.vlm import VisionDrafter
from tests.core.test_engine_sampling import assert_matches

VOCAB, IMAGE = 8, 7
SAMPLES, CHUNK = 6_000, 3_000
SAMPLING = specmm.SamplingConfig(temperature=0.8, top_k=4)


def tiny_llava() -> LlavaForConditionalGeneration:
    text = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, pad_token_id=0)
    vision = CLIPVisionConfig(image_size=16, patch_size=8, hidden_size=16, intermediate_size=32,
                              num_hidden_layers=1, num_attention_heads=2)
    config = LlavaConfig(vision_config=vision, text_config=text, image_token_id=IMAGE, vision_feature_layer=-1)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = LlavaForConditionalGeneration(config).eval()
    with torch.no_grad():
        model.lm_head.weight.normal_(0, 1.5)
        model.lm_head.weight[IMAGE] = -model.lm_head.weight[:IMAGE].mean(0) * 4  # image token rarely likely
    return model


def test_sampled_vispec_joint_distribution_matches_target():
    model = tiny_llava()
    prompt = torch.tensor([[3, IMAGE, IMAGE, IMAGE, IMAGE, 1, 5]])
    pixels = torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        first = process_logits(model(input_ids=prompt, pixel_values=pixels).logits[0, -1], SAMPLING)  # [V]
        assert first[IMAGE] == 0, "the reference below cannot append an image token"
        text = VOCAB - 1  # every token but the image token (which has no mass first)
        both = torch.cat([prompt.expand(text, -1), torch.arange(text)[:, None]], 1)
        second = torch.zeros(VOCAB, VOCAB)
        second[:text] = process_logits(
            model(input_ids=both, pixel_values=pixels.expand(text, -1, -1, -1)).logits[:, -1], SAMPLING)  # [V-1, V]
    joint = (first[:, None] * second).double()

    torch.manual_seed(0)
    drafter = VisionDrafter.for_target(model, method="vispec")
    generator = torch.Generator().manual_seed(5)
    counts = torch.zeros(VOCAB * VOCAB, dtype=torch.long)
    gen = specmm.SpeculativeGenerator(model, drafter, tree=specmm.TreeSpec.dynamic(depth=2, top_k=2, total_tokens=4))
    accepted = 0
    for _ in range(SAMPLES // CHUNK):
        out = gen.generate(prompt.expand(CHUNK, -1), max_new_tokens=2, sampling=SAMPLING, generator=generator,
                           eos_token_id=[],  # no EOS (the generation config's would end rows early)
                           pixel_values=pixels.expand(CHUNK, -1, -1, -1))
        new = out.sequences[:, prompt.shape[1]:]
        counts += torch.bincount(new[:, 0] * VOCAB + new[:, 1], minlength=VOCAB * VOCAB)
        accepted += sum(out.stats.accepted_histogram[1:])
    assert accepted > 0, "some drafts must be accepted for the test to say anything"
    assert_matches(counts, joint)
