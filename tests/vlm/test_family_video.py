"""Video inputs (Qwen2.5-VL, Qwen3-VL, LLaVA-OneVision): greedy tokens with untrained drafters equal the stock
model's own greedy `generate` on a ragged batch of 3 prompts (two videos of different lengths, an image prompt,
and a prompt with an image and a video), and bad video inputs are refused before any forward."""

from __future__ import annotations

import functools

import pytest
import torch
from transformers.utils import is_num2words_available

import specmm
import specmm.vlm
from specmm.vlm import DrafterTrainConfig, VisionDrafter, train_drafter
from tests.conftest import report_acceptance
from tests.vlm import test_families as families
from tests.vlm import test_family_pipeline as pipeline
from tests.vlm.test_pipeline import scene_images
from tests.vlm.test_targets import IMAGE, MAX_NEW, PAD, one_thread, reference_setup, tiny_qwen2_5_vl  # noqa: F401

VISION_START, VISION_END = 92, 93
QWEN_PATCH = 3 * 2 * 4 * 4  # channels * temporal patch * patch * patch


def _prompts(rows: list[list[tuple[int | None, int]]], seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded rows of (token, count) pieces, token None for random text -> (input_ids, attention_mask)."""
    gen = torch.Generator().manual_seed(seed)
    built = [torch.cat([torch.randint(1, 80, (n,), generator=gen) if token is None else torch.full((n,), token)
                        for token, n in row]) for row in rows]
    width = max(len(r) for r in built)
    ids = torch.full((len(built), width), PAD)
    mask = torch.zeros(len(built), width, dtype=torch.long)
    for i, row in enumerate(built):
        ids[i, width - len(row):], mask[i, width - len(row):] = row, 1
    return ids, mask


def _span(token: int, n: int) -> list[tuple[int | None, int]]:
    return [(VISION_START, 1), (token, n), (VISION_END, 1)]


def _qwen_inputs(model, frame_groups: bool) -> dict:
    """Row 0: a video of 2 temporal patches; row 1: an image; row 2: an image, then a video of 3 temporal
    patches with another grid. frame_groups (Qwen3-VL): each temporal patch is its own span after a timestamp."""
    video = model.config.video_token_id
    videos, images = torch.tensor([[2, 4, 4], [3, 2, 4]]), torch.tensor([[1, 4, 6], [1, 2, 4]])
    tokens = lambda grid: int(grid[1] * grid[2] // 4)  # noqa: E731  per temporal patch (2x2 merge)

    def video_pieces(grid):
        if not frame_groups:
            return _span(video, tokens(grid) * int(grid[0]))
        return [piece for _ in range(int(grid[0])) for piece in [(None, 2), *_span(video, tokens(grid))]]

    ids, mask = _prompts([[(None, 3), *video_pieces(videos[0]), (None, 4)],
                          [(None, 1), *_span(IMAGE, tokens(images[0])), (None, 6)],
                          [(None, 2), *_span(IMAGE, tokens(images[1])), (None, 1), *video_pieces(videos[1]),
                           (None, 2)]])
    gen = torch.Generator().manual_seed(2)
    inputs = dict(input_ids=ids, attention_mask=mask,
                  pixel_values=torch.randn(int(images.prod(-1).sum()), QWEN_PATCH, generator=gen, dtype=torch.float64),
                  image_grid_thw=images,
                  pixel_values_videos=torch.randn(int(videos.prod(-1).sum()), QWEN_PATCH, generator=gen,
                                                  dtype=torch.float64),
                  video_grid_thw=videos,
                  mm_token_type_ids=((ids == IMAGE).int() + 2 * (ids == video).int()))
    return inputs


def qwen2_5_vl_inputs(model) -> dict:
    """With seconds per temporal patch: the time axis of the M-RoPE positions is scaled per video."""
    return dict(_qwen_inputs(model, frame_groups=False), second_per_grid_ts=torch.tensor([0.5, 1.5]))


def qwen3_vl_inputs(model) -> dict:
    return _qwen_inputs(model, frame_groups=True)


def tiny_llava_onevision_video(seed: int = 0):
    model = families.tiny_llava_onevision(seed)
    model.config.video_token_id = 91
    return model


def llava_onevision_inputs(model) -> dict:
    """Row 0: a 2-frame video; row 1: an image; row 2: an image, then a 2-frame video (tokens: 2 frames x a 2x2
    pooled grid + a newline)."""
    gen = torch.Generator().manual_seed(2)
    sizes = torch.tensor([[20, 50], [40, 30]])
    pixels = torch.randn(2, 3, 3, 32, 32, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        counts = [f.shape[0] for f in model.model.get_image_features(pixels, sizes).pooler_output]
    video = model.config.video_token_id
    ids, mask = _prompts([[(None, 3), (video, 9), (None, 4)],
                          [(None, 1), (IMAGE, counts[0]), (None, 6)],
                          [(None, 2), (IMAGE, counts[1]), (None, 1), (video, 9), (None, 2)]])
    return dict(input_ids=ids, attention_mask=mask, pixel_values=pixels, image_sizes=sizes,
                pixel_values_videos=torch.randn(2, 2, 3, 32, 32, generator=gen, dtype=torch.float64))


FAMILIES = {"qwen2_5_vl": (tiny_qwen2_5_vl, qwen2_5_vl_inputs),
            "qwen3_vl": (families.tiny_qwen3_vl, qwen3_vl_inputs),
            "llava_onevision": (tiny_llava_onevision_video, llava_onevision_inputs)}
SPANS = {"qwen2_5_vl": 4, "qwen3_vl": 2 + 2 + 3, "llava_onevision": 4}  # visual spans: images, videos, frame groups
CASES = [(family, method) for family in FAMILIES for method in ("eagle", "vispec")] + [("qwen3_vl", "dream"),
                                                                                       ("qwen2_5_vl", "flash")]


@functools.cache
def setup(family: str):
    """(model, inputs, eos, reference sequences of the stock model's greedy generate)."""
    return reference_setup(*FAMILIES[family])


def _visual_tokens(model, ids: torch.Tensor) -> int:
    return int(((ids == model.config.image_token_id) | (ids == model.config.video_token_id)).sum())


@pytest.mark.parametrize("family, method", CASES)
def test_greedy_tokens_with_videos_equal_stock_generate(family, method):
    model, inputs, eos, reference = setup(family)
    torch.manual_seed(0)
    drafter = VisionDrafter.for_target(model, method=method, **({"num_latents": 2} if method == "flash" else {}))
    out = specmm.SpeculativeGenerator(model, drafter, tree=families.SPEC).generate(
        **inputs, max_new_tokens=MAX_NEW, eos_token_id=eos, pad_token_id=PAD)
    report_acceptance(f"vlm-video/{family}/{method}", out.stats)
    assert torch.equal(out.sequences, reference)
    assert drafter.image_tokens == _visual_tokens(model, inputs["input_ids"]), "video tokens are visual tokens"
    if method == "vispec":  # one compressed token per image, video or Qwen3-VL frame group
        assert drafter.visual_tokens_seen == SPANS[family]
    elif method in ("dream", "flash"):
        assert drafter.visual_tokens_seen < drafter.image_tokens
    stopped = [(row[inputs["input_ids"].shape[1]:] == eos).any().item() for row in reference]
    assert any(stopped) and not all(stopped), "EOS must end some rows and not others"


@pytest.mark.parametrize("family", list(FAMILIES))
def test_video_prefill_features_equal_stock_forward(family):
    """The prefill's M-RoPE positions over time (and DeepStack on video tokens) give the stock forward's features."""
    model, inputs, _, _ = setup(family)
    families.assert_prefill_features_equal_stock(model, inputs)


def _types_last(value: int):
    return lambda i: dict(i, mm_token_type_ids=torch.cat([i["mm_token_type_ids"][:, :-1],
                                                          torch.full((3, 1), value, dtype=torch.int)], 1))


BAD_INPUTS = {
    "qwen2_5_vl/fewer videos": ("qwen2_5_vl", lambda i: dict(i, pixel_values_videos=i["pixel_values_videos"][:32],
                                                             video_grid_thw=i["video_grid_thw"][:1],
                                                             second_per_grid_ts=i["second_per_grid_ts"][:1]),
                                r"pixel_values_videos: 1 videos need 8 video tokens \(8\) but input_ids hold 14"),
    "qwen2_5_vl/seconds": ("qwen2_5_vl", lambda i: dict(i, second_per_grid_ts=torch.ones(3)),
                           r"second_per_grid_ts: expected one value per video \(2\)"),
    "qwen2_5_vl/video grid": ("qwen2_5_vl", lambda i: dict(i, video_grid_thw=i["video_grid_thw"][:, :2]),
                              r"video_grid_thw: expected \[videos, 3\]"),
    "qwen3_vl/no videos": ("qwen3_vl", lambda i: {k: v for k, v in i.items()
                                                  if k not in ("pixel_values_videos", "video_grid_thw")},
                           "input_ids: hold 14 video tokens .* but no pixel_values_videos"),
    "qwen3_vl/types": ("qwen3_vl", lambda i: dict(i, mm_token_type_ids=i["mm_token_type_ids"] % 2),
                       r"mm_token_type_ids: does not mark exactly the video tokens of input_ids \(as 2\)"),
    "qwen3_vl/video token last": ("qwen3_vl", _types_last(2), r"last prompt token of row\(s\) \[0, 1, 2\] is a video"),
    "qwen3_vl/seconds": ("qwen3_vl", lambda i: dict(i, second_per_grid_ts=torch.ones(2)),
                         "second_per_grid_ts: not an input of Qwen2_5_VLTarget"),
    "llava_onevision/frames": ("llava_onevision", lambda i: dict(i, pixel_values_videos=i["pixel_values_videos"][0]),
                               r"pixel_values_videos: expected \[videos, frames, channels, height, width\]"),
    "llava_onevision/more frames": ("llava_onevision", lambda i: dict(i, pixel_values_videos=i["pixel_values_videos"]
                                                                      .repeat(1, 2, 1, 1, 1)),
                                    r"2 videos need 34 video tokens \(17, 17\) but input_ids hold 18"),
}


def _refused_before_any_forward(model, inputs: dict, message: str) -> None:
    calls = [0]
    hook = model.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    try:
        gen = specmm.SpeculativeGenerator(model, specmm.drafters.PromptLookupDrafter(), tree=specmm.TreeSpec.chain(2))
        with pytest.raises(ValueError, match=message):
            gen.generate(**inputs, max_new_tokens=2)
    finally:
        hook.remove()
    assert calls[0] == 0, "the error must come before any forward"


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_video_inputs_raise_before_any_forward(case):
    family, change, message = BAD_INPUTS[case]
    model, inputs, _, _ = setup(family)
    _refused_before_any_forward(model, change(inputs), message)


def test_videos_for_a_family_that_takes_them_as_frames_are_refused_with_a_hint():
    """InternVL's processor turns a video into image frames; `pixel_values_videos` is no input of its forward."""
    model = families.tiny_internvl()
    inputs = dict(families.internvl_inputs(model), pixel_values_videos=torch.ones(1, 2, 3, 32, 32))
    _refused_before_any_forward(model, inputs, "InternVLForConditionalGeneration takes videos as image frames")


def test_drafter_training_refuses_video_batches_before_any_forward():
    model, inputs, _, _ = setup("llava_onevision")
    drafter = VisionDrafter.for_target(model, method="vispec")
    calls = [0]
    hook = model.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    try:
        with pytest.raises(ValueError, match="video inputs .* are not supported in drafter training"):
            train_drafter(model, None, drafter, [inputs], DrafterTrainConfig(steps=1), progress=False)
    finally:
        hook.remove()
    assert calls[0] == 0


VIDEO_FAMILIES = ["qwen2_vl", "qwen3_vl", "llava_onevision", "internvl",  # InternVL, SmolVLM: frames as images
                  pytest.param("smolvlm", marks=pytest.mark.skipif(not is_num2words_available(),
                                                                   reason="SmolVLM's processor needs num2words"))]


@pytest.mark.parametrize("family", VIDEO_FAMILIES)
def test_video_prompts_from_the_family_processor_equal_stock_generate(family):
    """The family's own processor turns 4- and 6-frame videos (4 and 4 where its videos stack into one tensor) and an
    image into model inputs (InternVL, SmolVLM: frames as images); greedy tokens with a vispec drafter equal the
    stock greedy `generate` on them."""
    processor = pipeline.family_processor(family)
    model = pipeline.family_target(family, processor)
    # the middle prompt holds an image (SmolVLM's processor mixes up images and videos in one batch: a video)
    smolvlm = family == "smolvlm"
    middle = f"{processor.video_token if smolvlm else processor.image_token}\nDescribe."
    texts = [f"{processor.video_token}\nWhat happens?", middle, f"A clip: {processor.video_token}\nIt shows"]
    frames = torch.Generator().manual_seed(3)
    videos = [torch.randint(0, 256, (n, 32, 32, 3), generator=frames, dtype=torch.uint8).numpy()
              for n in ((4, 6) if family.startswith("qwen") else (4, 4, 4) if smolvlm else (4, 4))]
    if smolvlm:  # one list of videos per prompt: transformers before 5.24 reads a flat list's arrays as frames
        videos = [[video] for video in videos]
    inputs = dict(processor(text=texts, images=None if smolvlm else scene_images(1), videos=videos,
                            return_tensors="pt", padding=True, padding_side="left"))
    reference = model.generate(**inputs, do_sample=False, max_new_tokens=pipeline.MAX_NEW)
    torch.manual_seed(0)
    out = specmm.SpeculativeGenerator(model, VisionDrafter.for_target(model, method="vispec"), tree=families.SPEC
                                      ).generate(**inputs, max_new_tokens=pipeline.MAX_NEW)
    assert torch.equal(out.sequences, reference)
