"""SpeculativeVLM: a real LlavaProcessor in, texts out that equal decoding the stock model's greedy generate."""

from __future__ import annotations

import functools

import pytest
import torch
from PIL import Image

import specmm
from specmm.drafters import EagleDrafter, ModelDrafter
from specmm.vlm import SpeculativeVLM, with_image_token
from specmm.zoo import captioner, scenes
from tests.vlm.test_targets import one_thread  # noqa: F401  (autouse fixture)

MAX_NEW = 12
PROMPTS = ["Describe the picture.", "<image>\nWhat is in the top row?\n", "List every shape you can see, please."]


@functools.cache
def tiny_captioner():
    """(target, draft, processor): a random-weight tiny LLaVA with a real LlavaProcessor (CLIP image processor,
    byte-level BPE tokenizer with an <image> token) and a random Llama draft with the same vocabulary."""
    recipe = captioner.RECIPES["tiny"]
    tokenizer = captioner.train_tokenizer(vocab_size=300, captions=10)
    processor = captioner.make_processor(tokenizer, recipe)
    target = captioner.make_target(recipe, tokenizer, seed=0).to(torch.float64).eval()
    with torch.no_grad():  # sharp next-token distributions: greedy paths without near-ties
        target.get_output_embeddings().weight.normal_(0, 0.5)
    draft = captioner.make_draft(recipe, tokenizer, seed=1).to(torch.float64).eval()
    return target, draft, processor


def scene_images(count: int, size: int = 48) -> list[Image.Image]:
    return [scenes.render(captioner.scene_and_caption(seed)[0], size, seed=seed) for seed in range(count)]


def reference_texts(target, processor, images, prompts, max_new_tokens=MAX_NEW) -> list[str]:
    """What decoding the stock model's greedy generate gives for the same processor inputs."""
    texts = [with_image_token(p, processor.image_token) for p in prompts]
    inputs = processor(images=images, text=texts, return_tensors="pt", padding=True, padding_side="left")
    out = target.generate(**inputs, do_sample=False, max_new_tokens=max_new_tokens,
                          pad_token_id=processor.tokenizer.pad_token_id)
    return processor.batch_decode(out[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)


@pytest.mark.parametrize("drafter_name", ["model", "eagle"])
def test_texts_equal_decoded_stock_greedy_generate(drafter_name):
    target, draft, processor = tiny_captioner()
    images = scene_images(3)
    torch.manual_seed(0)
    drafter = ModelDrafter(draft) if drafter_name == "model" else EagleDrafter.for_target(target)
    svlm = SpeculativeVLM(target, processor, drafter, tree=specmm.TreeSpec.dynamic(depth=3, top_k=2, total_tokens=6))
    result = svlm.generate(images, PROMPTS, max_new_tokens=MAX_NEW)
    assert result.texts == reference_texts(target, processor, images, PROMPTS)
    assert all(result.texts) and result.stats.new_tokens == sum(result.stats.new_tokens_per_row)
    assert result.sequences.shape[0] == 3 and result.prompt_length < result.sequences.shape[1]


def test_one_prompt_for_all_images_and_image_token_is_prepended():
    target, draft, processor = tiny_captioner()
    images = scene_images(2)
    svlm = SpeculativeVLM(target, processor, ModelDrafter(draft), tree=specmm.TreeSpec.chain(3))
    plain = svlm.generate(images, "Describe.", max_new_tokens=6)
    explicit = svlm.generate(images, ["<image>\nDescribe."] * 2, max_new_tokens=6)
    assert plain.texts == explicit.texts
    assert torch.equal(plain.sequences, explicit.sequences)
    assert with_image_token("Describe.", "<image>") == "<image>\nDescribe."
    assert with_image_token("A <image> B", "<image>") == "A <image> B"


def test_bad_arguments_raise_value_errors():
    target, draft, processor = tiny_captioner()
    svlm = SpeculativeVLM(target, processor, ModelDrafter(draft))
    with pytest.raises(ValueError, match="images: expected at least one"):
        svlm.generate([], "Describe.")
    with pytest.raises(ValueError, match="images: item 1 is a str"):
        svlm.generate([scene_images(1)[0], "cat.png"], "Describe.")
    with pytest.raises(ValueError, match="prompts: expected a string or 2 strings"):
        svlm.generate(scene_images(2), ["a", "b", "c"])
    with pytest.raises(ValueError, match="processor: .* is not a VLM processor"):
        SpeculativeVLM(target, processor.tokenizer, ModelDrafter(draft))
    with pytest.raises(ValueError, match="target_model: LlamaForCausalLM is not a vision-language model"):
        SpeculativeVLM(draft, processor, ModelDrafter(draft))


def test_sampling_with_per_row_generators_is_reproducible():
    target, draft, processor = tiny_captioner()
    svlm = SpeculativeVLM(target, processor, ModelDrafter(draft), tree=specmm.TreeSpec.dynamic(3, 2, 6))
    sampling = specmm.SamplingConfig(temperature=8.0)  # flat: the seeds must matter

    def run(seed: int) -> list[str]:
        generators = [torch.Generator().manual_seed(seed + row) for row in range(3)]
        return svlm.generate(scene_images(3), PROMPTS, max_new_tokens=MAX_NEW, sampling=sampling,
                             generator=generators).texts

    assert run(0) == run(0)
    assert run(0) != run(100)
