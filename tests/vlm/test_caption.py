"""Batch captioning: one JSON line per image, resume after a kill, unreadable images, CLI argument errors."""

from __future__ import annotations

import json
import shutil

import pytest

import specmm
from specmm.cli import main
from specmm.drafters import ModelDrafter
from specmm.vlm import SpeculativeVLM, caption_images, find_images
from tests.vlm.test_pipeline import reference_texts, scene_images, tiny_captioner
from tests.vlm.test_targets import one_thread  # noqa: F401  (autouse fixture)

PROMPT = "Describe the picture."
MAX_NEW = 8


@pytest.fixture
def image_dir(tmp_path):
    """Three scene PNGs and one file that is not an image."""
    folder = tmp_path / "images"
    folder.mkdir()
    for i, image in enumerate(scene_images(3)):
        image.save(folder / f"scene{i}.png")
    (folder / "broken.png").write_bytes(b"not a png")
    (folder / "notes.txt").write_text("ignored: not an image suffix")
    return folder


def _svlm():
    target, draft, processor = tiny_captioner()
    return SpeculativeVLM(target, processor, ModelDrafter(draft), tree=specmm.TreeSpec.chain(3))


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_captions_are_written_one_line_per_image_and_unreadable_images_become_error_lines(image_dir, tmp_path):
    paths = find_images(image_dir)
    assert [p.name for p in paths] == ["broken.png", "scene0.png", "scene1.png", "scene2.png"]
    out = tmp_path / "captions.jsonl"
    summary = caption_images(_svlm(), paths, out, batch_size=2, max_new_tokens=MAX_NEW, prompt=PROMPT,
                             progress=False)
    lines = _lines(out)
    assert [line["image"] for line in lines] == [str(p) for p in paths]
    assert lines[0]["image"].endswith("broken.png") and "UnidentifiedImageError" in lines[0]["error"]
    target, _, processor = tiny_captioner()
    expected = reference_texts(target, processor, scene_images(3), [PROMPT] * 3, max_new_tokens=MAX_NEW)
    assert [line["caption"] for line in lines[1:]] == expected
    assert all(1 <= line["new_tokens"] <= MAX_NEW and line["mean_accepted"] >= 1.0 for line in lines[1:])
    caption = summary.caption
    assert (caption.captioned, caption.errors, caption.skipped) == (3, 1, 0)
    # the batches' stats summed: one row per captioned image, in output order
    assert summary.new_tokens_per_row == [line["new_tokens"] for line in lines[1:]]
    assert summary.new_tokens == sum(summary.new_tokens_per_row) and len(summary.target_forwards_per_row) == 3
    assert summary.mean_accepted == summary.new_tokens / summary.row_forwards >= 1.0
    assert [line["mean_accepted"] for line in lines[1:]] == [round(m, 4) for m in summary.mean_accepted_per_row]
    assert summary.target_forwards >= max(summary.target_forwards_per_row) and summary.wall_time_s > 0
    assert summary.summary()["caption"] == {"captioned": 3, "skipped": 0, "errors": 1}


def test_resume_after_a_kill_captions_every_image_once_with_the_same_captions(image_dir, tmp_path):
    paths = sorted(image_dir.glob("scene*.png"))
    full = tmp_path / "full.jsonl"
    caption_images(_svlm(), paths, full, batch_size=1, max_new_tokens=MAX_NEW, prompt=PROMPT, progress=False)
    first, second = full.read_text().splitlines(keepends=True)[:2]
    killed = tmp_path / "killed.jsonl"
    killed.write_text(first + second[: len(second) // 2])  # one complete line, then a torn one
    shutil.copy(tmp_path / "full.jsonl.job.json", tmp_path / "killed.jsonl.job.json")  # the same job's manifest
    with pytest.raises(ValueError, match="out_path: .* exists and is not empty; resume it"):
        caption_images(_svlm(), paths, killed, prompt=PROMPT, progress=False)
    summary = caption_images(_svlm(), paths, killed, batch_size=2, max_new_tokens=MAX_NEW, resume=True,
                             prompt=PROMPT, progress=False)
    assert (summary.caption.skipped, summary.caption.captioned) == (1, 2)
    assert sorted(_lines(killed), key=lambda r: r["image"]) == _lines(full)
    again = caption_images(_svlm(), paths, killed, max_new_tokens=MAX_NEW, resume=True, prompt=PROMPT, progress=False)
    assert (again.caption.skipped, again.caption.captioned, again.new_tokens) == (3, 0, 0)
    assert len(_lines(killed)) == 3


def test_resume_refuses_a_corrupt_middle_line(image_dir, tmp_path):
    out = tmp_path / "captions.jsonl"
    caption_images(_svlm(), find_images(image_dir), out, max_new_tokens=MAX_NEW, progress=False)
    good = out.read_text().splitlines(keepends=True)
    out.write_text(good[0] + "not json\n" + "".join(good[2:]))
    with pytest.raises(ValueError, match="line 2 of .* is not a caption record"):
        caption_images(_svlm(), find_images(image_dir), out, max_new_tokens=MAX_NEW, resume=True, progress=False)


def test_resume_without_a_manifest_is_refused(image_dir, tmp_path):
    out = tmp_path / "captions.jsonl"
    out.write_text('{"image": "a.png", "caption": "x"}\n')  # written by an older specmm, or by hand
    with pytest.raises(ValueError, match="out_path: .* holds results but no readable job manifest .* force=True"):
        caption_images(_svlm(), find_images(image_dir), out, resume=True, progress=False)


def test_compile_passes_through_to_the_core_generator():
    target, draft, processor = tiny_captioner()
    svlm = SpeculativeVLM(target, processor, ModelDrafter(draft), compile=True)
    assert svlm.generator.compile and not _svlm().generator.compile


def test_bad_arguments_raise_before_any_work(image_dir, tmp_path):
    svlm, out = _svlm(), tmp_path / "out.jsonl"
    with pytest.raises(ValueError, match="image_paths: no images given"):
        caption_images(svlm, [], out, progress=False)
    with pytest.raises(ValueError, match="batch_size: expected an integer >= 1, got 0"):
        caption_images(svlm, find_images(image_dir), out, batch_size=0, progress=False)
    with pytest.raises(ValueError, match="max_new_tokens: expected an integer >= 1"):
        caption_images(svlm, find_images(image_dir), out, max_new_tokens=0, progress=False)
    with pytest.raises(ValueError, match="images: no image files match"):
        find_images(tmp_path / "nothing" / "*.png")
    assert not out.exists()


def test_cli_caption_end_to_end_with_prompt_lookup_and_draft_lm(image_dir, tmp_path):
    target, draft, processor = tiny_captioner()
    target.save_pretrained(tmp_path / "target")
    processor.save_pretrained(tmp_path / "target")
    draft.save_pretrained(tmp_path / "draft")
    out = tmp_path / "cli.jsonl"
    common = ["caption", "--target", str(tmp_path / "target"), "--images", str(image_dir / "scene*.png"),
              "--out", str(out), "--batch-size", "2", "--max-new-tokens", str(MAX_NEW), "--prompt", PROMPT,
              "--device", "cpu", "--dtype", "float32"]
    assert main(common + ["--drafter", "prompt-lookup"]) == 0
    lines = _lines(out)
    assert len(lines) == 3 and all("caption" in line for line in lines)
    out.write_text("")  # an empty file is not refused
    assert main(common + ["--draft-lm", str(tmp_path / "draft")]) == 0
    assert [line["caption"] for line in _lines(out)] == [line["caption"] for line in lines]


@pytest.mark.parametrize("argv, message", [
    (["--drafter", "prompt-lookup", "--images", "{tmp}/none/*.png"], "images: no image files match"),
    (["--drafter", "prompt-lookup", "--out", "{tmp}/existing.jsonl"], "exists and is not empty"),
    (["--drafter", "{tmp}/no-drafter"], "no-drafter"),  # a drafter folder that does not exist
])
def test_cli_caption_errors_exit_2_with_a_message(argv, message, image_dir, tmp_path, capsys):
    (tmp_path / "existing.jsonl").write_text('{"image": "a.png", "caption": "x"}\n')
    defaults = {"--target": str(tmp_path / "missing-target"), "--images": str(image_dir),
                "--out": str(tmp_path / "out.jsonl")}
    argv = [a.format(tmp=tmp_path) for a in argv]
    for flag, value in defaults.items():
        if flag not in argv:
            argv += [flag, value]
    target, _, processor = tiny_captioner()
    if message == "no-drafter":  # needs a loadable target to get as far as the drafter
        target.save_pretrained(tmp_path / "missing-target")
        processor.save_pretrained(tmp_path / "missing-target")
    assert main(["caption", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ["--images", "x", "--out", "o.jsonl", "--target", "t"],  # neither --drafter nor --draft-lm
    ["--images", "x", "--out", "o.jsonl", "--target", "t", "--drafter", "prompt-lookup", "--draft-lm", "d"],
    ["--images", "x", "--out", "o.jsonl", "--target", "t", "--drafter", "prompt-lookup", "--batch-size", "0"],
    ["--images", "x", "--out", "o.jsonl", "--target", "t", "--drafter", "prompt-lookup", "--dtype", "int8"],
])
def test_cli_caption_argument_errors_are_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["caption", *argv])
    assert exit_info.value.code == 2
    assert "usage: specmm caption" in capsys.readouterr().err
