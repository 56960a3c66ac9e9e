"""Each new VLM family with its own HF processor: `SpeculativeVLM` texts equal the stock greedy `generate`, and
`specmm train-drafter` / `specmm caption` accept the family's saved folder (model + processor)."""

from __future__ import annotations

import functools
import json

import pytest
import torch
import transformers as hf
from tokenizers import Tokenizer
from transformers.utils import is_num2words_available

import specmm
from specmm.cli import main
from specmm.vlm import SpeculativeVLM, VisionDrafter, with_image_token
from specmm.zoo import captioner
from tests.vlm import test_families as families
from tests.vlm.test_pipeline import scene_images
from tests.vlm.test_targets import one_thread  # noqa: F401  (autouse fixture)

PROMPTS = ["Describe the picture.", "What is in it?", "A picture of"]
MAX_NEW = 8
SPECIAL_TOKENS = {  # the tokenizer attributes each family's processor reads
    "gemma3": {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"},
    "idefics3": {},  # the processor adds its own
    "smolvlm": {"fake_image_token": "<fake_token_around_image>", "image_token": "<image>",
                "global_image_token": "<global-img>", "end_of_utterance_token": "<end_of_utterance>",
                "video_token": "<video>"},
    "llava_onevision": {"image_token": "<image>", "video_token": "<video>"},
    "qwen2_vl": {"image_token": "<|image_pad|>", "video_token": "<|video_pad|>",
                 "vision_start_token": "<|vision_start|>", "vision_end_token": "<|vision_end|>"},
    "internvl": {"start_image_token": "<img>", "end_image_token": "</img>", "context_image_token": "<IMG_CONTEXT>",
                 "video_token": "<video>"},
}
SPECIAL_TOKENS["qwen3_vl"] = SPECIAL_TOKENS["qwen2_vl"]
FAMILIES = [family if family != "smolvlm" else  # SmolVLM's processor needs the `num2words` package
            pytest.param(family, marks=pytest.mark.skipif(not is_num2words_available(), reason="needs num2words"))
            for family in SPECIAL_TOKENS]


@functools.cache
def _base_tokenizer() -> str:
    return captioner.train_tokenizer(vocab_size=300, captions=10).backend_tokenizer.to_str()


def family_tokenizer(family: str) -> hf.PreTrainedTokenizerFast:
    """The zoo captioner's byte-level BPE (EOS, PAD, <image>) plus the family's special tokens."""
    extra = SPECIAL_TOKENS[family]
    tokenizer = hf.PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(_base_tokenizer()), bos_token="</s>",
                                           eos_token="</s>", pad_token="<pad>", extra_special_tokens=extra,
                                           model_max_length=1 << 16)
    tokenizer.add_special_tokens({"additional_special_tokens": list(extra.values())})
    return tokenizer


def family_processor(family: str):
    """The family's own processor, sized for the tiny configs of `test_families` (32x32 images and video frames)."""
    tokenizer = family_tokenizer(family)
    if family == "gemma3":
        return hf.Gemma3Processor(hf.Gemma3ImageProcessor(size={"height": 32, "width": 32}), tokenizer,
                                  image_seq_length=4)
    if family == "idefics3":
        images = hf.Idefics3ImageProcessor(size={"longest_edge": 32}, max_image_size={"longest_edge": 32},
                                           do_image_splitting=False)
        return hf.Idefics3Processor(images, tokenizer, image_seq_len=4)
    if family == "smolvlm":
        images = hf.SmolVLMImageProcessor(size={"longest_edge": 32}, max_image_size={"longest_edge": 32},
                                          do_image_splitting=False)
        videos = hf.SmolVLMVideoProcessor(size={"longest_edge": 32}, max_image_size={"longest_edge": 32})
        return hf.SmolVLMProcessor(images, tokenizer, videos, image_seq_len=4)
    if family == "llava_onevision":
        images = hf.LlavaOnevisionImageProcessor(size={"height": 32, "width": 32},
                                                 image_grid_pinpoints=[[32, 32], [32, 64], [64, 32]])
        # 16 patch tokens per tile: the tiny CLIP tower's CLS token is already dropped, so no "default" subtraction
        videos = hf.LlavaOnevisionVideoProcessor(size={"height": 32, "width": 32})
        return hf.LlavaOnevisionProcessor(images, tokenizer, videos, num_image_tokens=16,
                                          vision_feature_select_strategy="full", vision_aspect_ratio="anyres_max_1")
    if family in ("qwen2_vl", "qwen3_vl"):
        images = hf.Qwen2VLImageProcessor(patch_size=4, merge_size=2, temporal_patch_size=2, min_pixels=16 * 16,
                                          max_pixels=32 * 32)
        sized = dict(patch_size=4, merge_size=2, temporal_patch_size=2, cap_pixels_per_frame=True,
                     size={"shortest_edge": 16 * 16, "longest_edge": 32 * 32})
        if family == "qwen2_vl":
            return hf.Qwen2VLProcessor(images, tokenizer, hf.Qwen2VLVideoProcessor(**sized))
        return hf.Qwen3VLProcessor(images, tokenizer, hf.Qwen3VLVideoProcessor(**sized, do_sample_frames=False))
    images = hf.GotOcr2ImageProcessor(size={"height": 32, "width": 32}, crop_to_patches=False)
    videos = hf.InternVLVideoProcessor(size={"height": 32, "width": 32})
    return hf.InternVLProcessor(images, tokenizer, videos, image_seq_length=4)


def family_target(family: str, processor):
    """The tiny model of `family` over the processor's vocabulary and token ids, stopping at its EOS."""
    tokenizer = processor.tokenizer
    ids = {k: tokenizer.convert_tokens_to_ids(v) for k, v in SPECIAL_TOKENS[family].items()}
    vocab, image = len(tokenizer), processor.image_token_id
    if family == "gemma3":
        model = families.tiny_gemma3(vocab=vocab, image=ids["image_token"], boi=ids["boi_token"],
                                     eoi=ids["eoi_token"])
    elif family in ("qwen2_vl", "qwen3_vl"):
        build = families.tiny_qwen2_vl if family == "qwen2_vl" else families.tiny_qwen3_vl
        model = build(vocab=vocab, image_token_id=image, video_token_id=ids["video_token"],
                      vision_start_token_id=ids["vision_start_token"], vision_end_token_id=ids["vision_end_token"])
    else:
        build = {"idefics3": families.tiny_idefics3, "smolvlm": functools.partial(families.tiny_idefics3, smolvlm=True),
                 "llava_onevision": families.tiny_llava_onevision, "internvl": families.tiny_internvl}[family]
        model = build(vocab=vocab, image=image)
        if family == "llava_onevision":
            model.config.video_token_id = ids["video_token"]
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def stock_texts(model, processor, images, prompts) -> list[str]:
    """What decoding the stock model's greedy generate gives for the same processor inputs."""
    texts = [with_image_token(p, processor.image_token) for p in prompts]
    inputs = processor(images=[[image] for image in images], text=texts, return_tensors="pt", padding=True,
                       padding_side="left")
    out = model.generate(**inputs, do_sample=False, max_new_tokens=MAX_NEW)
    return processor.batch_decode(out[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)


@pytest.mark.parametrize("family", FAMILIES)
def test_pipeline_texts_equal_stock_generate_with_the_family_processor(family):
    processor = family_processor(family)
    model = family_target(family, processor)
    images = scene_images(3)
    torch.manual_seed(0)
    svlm = SpeculativeVLM(model, processor, VisionDrafter.for_target(model, method="vispec"),
                          tree=specmm.TreeSpec.dynamic(depth=3, top_k=2, total_tokens=6))
    result = svlm.generate(images, PROMPTS, max_new_tokens=MAX_NEW)
    assert result.texts == stock_texts(model, processor, images, PROMPTS)
    assert result.stats.new_tokens > 3


@pytest.mark.parametrize("family", FAMILIES)
def test_cli_train_drafter_and_caption_accept_the_family_folder(family, tmp_path):
    """The saved folder loads through AutoModelForImageTextToText / AutoProcessor; a vispec drafter trained on
    it for a step per stage then captions exactly as the loaded model's own greedy generate."""
    processor = family_processor(family)
    family_target(family, processor).to(torch.float32).save_pretrained(tmp_path / "target")
    processor.save_pretrained(tmp_path / "target")
    folder = tmp_path / "images"
    folder.mkdir()
    for i, image in enumerate(scene_images(2)):
        image.save(folder / f"scene{i}.png")
    data = tmp_path / "captions.jsonl"
    data.write_text("".join(json.dumps({"image": str(folder / f"scene{i}.png"), "caption": "a red circle"}) + "\n"
                            for i in range(2)))
    common = ["--target", str(tmp_path / "target"), "--device", "cpu", "--dtype", "float32"]
    assert main(["train-drafter", *common, "--data", str(data), "--method", "vispec", "--text-steps", "1",
                 "--multimodal-steps", "1", "--batch-size", "2", "--out", str(tmp_path / "drafter")]) == 0
    out = tmp_path / "captions-out.jsonl"
    assert main(["caption", *common, "--images", str(folder / "*.png"), "--drafter", str(tmp_path / "drafter"),
                 "--out", str(out), "--batch-size", "2", "--max-new-tokens", str(MAX_NEW),
                 "--prompt", PROMPTS[0]]) == 0
    model = hf.AutoModelForImageTextToText.from_pretrained(tmp_path / "target").eval()
    loaded = hf.AutoProcessor.from_pretrained(tmp_path / "target")
    expected = stock_texts(model, loaded, scene_images(2), PROMPTS[:1] * 2)
    assert any(expected), "the captions must say something for the comparison to mean anything"
    assert [json.loads(line)["caption"] for line in out.read_text().splitlines()] == expected
