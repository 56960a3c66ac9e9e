"""One error path: expected failures print `specmm: error: <what, which argument or file>` and exit 2 (argument
errors are usage errors, exit 2); `-v` adds the traceback. Nothing here may end in a bare traceback."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pytest
import torch

from specmm.cli import main

FIXTURES = Path("/work/shared/fixtures/llamagen")


def images_args(tmp_path, gpt_ckpt=FIXTURES / "gpt_c2i.pt", gpt_config=FIXTURES / "gpt_c2i_config.json"):
    return ["sample-images", "--gpt-ckpt", str(gpt_ckpt), "--vq-ckpt", str(FIXTURES / "vq.pt"),
            "--gpt-config", str(gpt_config), "--vq-config", str(FIXTURES / "vq_config.json"), "--classes", "1",
            "--per-class", "1", "--method", "ar", "--out", str(tmp_path / "out")]


def error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return next(line for line in err.splitlines() if line.startswith("specmm: error: "))


def test_a_checkpoint_that_does_not_fit_its_config_names_the_files(tmp_path, capsys):
    config = json.loads((FIXTURES / "gpt_c2i_config.json").read_text())
    (tmp_path / "wide.json").write_text(json.dumps({**config, "dim": 128}))
    assert main(images_args(tmp_path, gpt_config=tmp_path / "wide.json")) == 2
    line = error_line(capsys)
    assert "--gpt-ckpt/--vq-ckpt: cannot load the LlamaGen checkpoints at" in line and "size mismatch" in line
    assert str(FIXTURES / "gpt_c2i.pt") in line


def test_a_refused_pickle_names_the_file(tmp_path, capsys):
    torch.save({"model": argparse.Namespace(evil=True)}, tmp_path / "gpt.pt")  # weights_only=True refuses it
    assert main(images_args(tmp_path, gpt_ckpt=tmp_path / "gpt.pt")) == 2
    line = error_line(capsys)
    assert "cannot load the LlamaGen checkpoints" in line and "UnpicklingError" in line and "gpt.pt" in line


def test_a_missing_checkpoint_names_the_argument(tmp_path, capsys):
    assert main(images_args(tmp_path, gpt_ckpt=tmp_path / "none.pt")) == 2
    assert f"--gpt-ckpt: {tmp_path / 'none.pt'} does not exist" in error_line(capsys)


def test_a_corrupt_safetensors_header_names_the_folder(tiny_zoo, tmp_path, capsys):
    folder = tiny_zoo("chainarith")
    broken = tmp_path / "target"
    shutil.copytree(folder / "target", broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(b"\xff" * 8 + weights.read_bytes()[8:])  # a header length past the end of the file
    (tmp_path / "p.txt").write_text("1+2=\n")
    assert main(["reason", "--target", str(broken), "--draft", str(folder / "draft"), "--prompts",
                 str(tmp_path / "p.txt"), "--policy", "target-only", "--out", str(tmp_path / "o.jsonl")]) == 2
    line = error_line(capsys)
    assert f"--target: cannot load the model at {broken}" in line


@pytest.mark.parametrize("where", ["before", "after"])
def test_verbose_adds_the_traceback(tmp_path, capsys, where):
    args = images_args(tmp_path, gpt_ckpt=tmp_path / "none.pt")
    assert main(["-v", *args] if where == "before" else [*args, "-v"]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "specmm: error: --gpt-ckpt" in err


def test_cuda_without_a_gpu_is_a_usage_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exit_info:
        main([*images_args(tmp_path), "--device", "cuda"])
    assert exit_info.value.code == 2
    assert "argument --device: cuda: no CUDA GPU is available on this machine" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*images_args(tmp_path), "--device", "tpu"])
    assert "argument --device: expected" in capsys.readouterr().err


def test_ctrl_c_ends_with_one_line_and_exit_130(tmp_path, capsys, monkeypatch):
    import specmm.cli.images as images

    def interrupted(args):
        raise KeyboardInterrupt
    monkeypatch.setattr(images, "check_source", interrupted)
    assert main(images_args(tmp_path)) == 130
    err = capsys.readouterr().err
    assert "Traceback" not in err and "specmm: interrupted; what was finished is kept" in err


def test_an_image_folder_that_cannot_be_made_is_refused_before_any_model_loads(tmp_path, capsys, monkeypatch):
    import specmm.cli.images as images

    monkeypatch.setattr(images, "check_source", lambda args: pytest.fail("sources read before the refusal"))
    (tmp_path / "out").write_text("a file where the folder goes")
    assert main(images_args(tmp_path)) == 2
    assert f"--out: {tmp_path / 'out'} is a file, expected a folder" in error_line(capsys)
    assert main([*images_args(tmp_path)[:-1], str(tmp_path / "out" / "sub")]) == 2
    assert "cannot be written: " in error_line(capsys)
