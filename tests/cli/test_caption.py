"""`specmm caption` as a job: images are keyed by their resolved path (however --images is spelled), resume continues
only the same job, a second concurrent run is refused, NaN weights are an error (not empty captions)."""

from __future__ import annotations

import json

import pytest
import torch

from specmm.cli import main
from specmm.jobs import Job
from tests.vlm.test_pipeline import scene_images, tiny_captioner


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """(target folder, images folder with 5 scenes): saved once for the module."""
    root = tmp_path_factory.mktemp("caption")
    target, _, processor = tiny_captioner()
    target.save_pretrained(root / "target")
    processor.save_pretrained(root / "target")
    (root / "imgs").mkdir()
    for i, image in enumerate(scene_images(5)):
        image.save(root / "imgs" / f"scene{i}.png")
    return root / "target", root / "imgs"


def caption(target, images, out, *extra):
    return main(["caption", "--target", str(target), "--drafter", "prompt-lookup", "--images", str(images), "--out",
                 str(out), "--batch-size", "2", "--max-new-tokens", "6", "--device", "cpu", *extra])


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_resume_matches_images_however_the_folder_is_spelled(folders, tmp_path, monkeypatch):
    target, imgs = folders
    out = tmp_path / "captions.jsonl"
    monkeypatch.chdir(imgs.parent)
    assert caption(target, "imgs", out) == 0
    first = lines(out)
    assert [r["image"] for r in first] == [str(imgs.resolve() / f"scene{i}.png") for i in range(5)]
    assert caption(target, imgs.resolve(), out, "--resume") == 0  # /abs/imgs
    monkeypatch.chdir(imgs)
    assert caption(target, ".", out, "--resume") == 0  # .
    assert caption(target, "./*.png", out, "--resume") == 0  # a glob
    assert lines(out) == first  # 5 lines for 5 images, not 20


def test_resume_of_another_job_is_refused_naming_what_differs(folders, tmp_path, capsys):
    target, imgs = folders
    out = tmp_path / "captions.jsonl"
    assert caption(target, imgs, out) == 0
    before = out.read_bytes()
    assert caption(target, imgs, out, "--resume", "--prompt", "Name the shapes.") == 2
    # the prompts as sent: each instruction in the zoo captioner's chat template (its training format)
    assert 'prompt: "<image>\\nDescribe the picture in detail.\\n" -> "<image>\\nName the shapes.\\n"' in (
        capsys.readouterr().err)
    assert caption(target, imgs, out, "--resume", "--max-new-tokens", "7") == 2
    assert "max_new_tokens: 6 -> 7" in capsys.readouterr().err
    assert out.read_bytes() == before
    assert caption(target, imgs, out, "--force", "--prompt", "Name the shapes.") == 0
    assert len(lines(out)) == 5


def test_a_second_concurrent_run_on_the_same_output_is_refused(folders, tmp_path, capsys):
    target, imgs = folders
    out = tmp_path / "captions.jsonl"
    with Job(out, "caption", {}):
        assert caption(target, imgs, out, "--resume") == 2
    assert f"--out: {out} is being written by another specmm job (PID" in capsys.readouterr().err
    assert not out.exists()


def test_nan_weights_are_an_error_not_empty_captions(folders, tmp_path, capsys):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    target, imgs = folders
    model = AutoModelForImageTextToText.from_pretrained(target)
    with torch.no_grad():
        model.get_output_embeddings().weight.fill_(float("nan"))
    model.save_pretrained(tmp_path / "broken")
    AutoProcessor.from_pretrained(target).save_pretrained(tmp_path / "broken")
    out = tmp_path / "captions.jsonl"
    assert caption(tmp_path / "broken", imgs, out) == 2
    err = capsys.readouterr().err
    assert "specmm: error: LlavaForConditionalGeneration" in err and "non-finite logits" in err
    assert "decoding round 1" in err and (not out.exists() or out.read_text() == "")


def test_a_budget_past_the_context_is_refused_before_any_work(folders, tmp_path, capsys):
    target, imgs = folders
    out = tmp_path / "captions.jsonl"
    assert caption(target, imgs, out, "--max-new-tokens", "600") == 2  # the tiny LLaVA has 512 positions
    assert "--max-new-tokens: 600 new tokens (+ 9 for drafts) leave no room" in capsys.readouterr().err
    assert not out.exists()


def test_an_image_whose_prompt_cannot_fit_becomes_an_error_line(folders, tmp_path):
    target, imgs = folders
    out = tmp_path / "captions.jsonl"
    assert caption(target, imgs, out, "--max-new-tokens", "490") == 0  # 490 + the image tokens + prompt > 512
    records = lines(out)
    assert len(records) == 5 and all("exceeds the model's context of 512" in r["error"] for r in records)
