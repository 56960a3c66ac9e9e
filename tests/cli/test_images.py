"""`specmm sample-images` on upstream-layout checkpoints: PNGs, a grid, resume of the same job only, atomic files,
half-written PNGs redone, and clear errors."""

import json
from pathlib import Path

import pytest
from PIL import Image

from specmm.cli import main

FIXTURES = Path("/work/shared/fixtures/llamagen")
pytestmark = pytest.mark.skipif(not FIXTURES.is_dir(), reason="LlamaGen fixtures not available")
ARGS = ["sample-images", "--gpt-ckpt", str(FIXTURES / "gpt_c2i.pt"), "--vq-ckpt", str(FIXTURES / "vq.pt"),
        "--gpt-config", str(FIXTURES / "gpt_c2i_config.json"), "--vq-config", str(FIXTURES / "vq_config.json"),
        "--image-size", "8", "--top-k", "16", "--cfg-scale", "2.0", "--per-class", "2", "--batch-size", "3"]


def pngs(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("class*.png"))}


def test_sample_images_writes_pngs_grid_and_resumes_only_the_same_job(tmp_path, capsys):
    out = tmp_path / "images"
    assert main([*ARGS, "--classes", "1,2", "--method", "sjd", "--out", str(out)]) == 0
    full = pngs(out)
    assert list(full) == ["class0001_000.png", "class0001_001.png", "class0002_000.png", "class0002_001.png"]
    assert (out / "grid.png").is_file() and json.loads((out / "summary.json").read_text())["method"] == "sjd"
    assert not list(out.glob(".*.tmp"))  # atomic writes leave no temporaries behind
    (out / "class0002_001.png").unlink()
    assert main([*ARGS, "--classes", "1,2", "--method", "gsd", "--out", str(out)]) == 2  # exists, no --resume
    # another method, seed or temperature is another job: refused, naming what differs, nothing mixed in
    for change, setting in ((["--method", "gsd"], "method"), (["--seed", "5"], "seed"),
                            (["--temperature", "0.5"], "temperature")):
        capsys.readouterr()
        assert main([*ARGS, "--classes", "1,2", "--method", "sjd", *change, "--out", str(out), "--resume"]) == 2
        assert f"{setting}:" in capsys.readouterr().err and not (out / "class0002_001.png").exists()
    assert main([*ARGS, "--classes", "1,2", "--method", "sjd", "--out", str(out), "--resume"]) == 0
    assert pngs(out) == full  # the missing image is exactly the uninterrupted run's
    assert json.loads((out / "summary.json").read_text())["sampled_now"] == 1
    assert main([*ARGS, "--classes", "1,2", "--method", "gsd", "--out", str(out), "--force"]) == 0
    assert json.loads((out / "summary.json").read_text())["method"] == "gsd"
    settings = json.loads((out / "job.json").read_text())["settings"]
    assert settings["method"] == "gsd" and (settings["gsd_window"], settings["gsd_gap"]) == (14, 0.15)
    capsys.readouterr()  # GSD's knobs are the job's too: another gap is another job
    assert main([*ARGS, "--classes", "1,2", "--method", "gsd", "--gsd-gap", "0.3", "--out", str(out), "--resume"]) == 2
    assert "gsd_gap:" in capsys.readouterr().err


def test_a_half_written_png_is_sampled_again_on_resume(tmp_path):
    out = tmp_path / "images"
    assert main([*ARGS, "--classes", "1", "--method", "ar", "--out", str(out)]) == 0
    full = pngs(out)
    broken = out / "class0001_001.png"
    broken.write_bytes(full[broken.name][: len(full[broken.name]) // 2])  # what a kill mid-save used to leave
    with pytest.raises(OSError):
        Image.open(broken).load()
    assert main([*ARGS, "--classes", "1", "--method", "ar", "--out", str(out), "--resume"]) == 0
    assert pngs(out) == full


def test_sample_images_errors(tmp_path, capsys):
    assert main([*ARGS, "--classes", "1,10", "--method", "sjd", "--out", str(tmp_path / "a")]) == 2
    assert "--classes" in capsys.readouterr().err
    assert main([*ARGS, "--classes", "1", "--method", "lantern", "--out", str(tmp_path / "b")]) == 2
    assert "drafter" in capsys.readouterr().err
    for flag, value in (("--latent-size", "2x2"), ("--negative-prompt", "blurry")):  # stock generators' options
        assert main([*ARGS, "--classes", "1", flag, value, "--out", str(tmp_path / "c")]) == 2
        assert f"{flag}: for a stock generator folder (--model)" in capsys.readouterr().err


def test_image_size_error_states_the_valid_size(tmp_path, capsys):
    args = [a if a != "8" else "17" for a in ARGS]  # --image-size 17
    assert main([*args, "--classes", "1", "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert "--image-size: the only valid size for these checkpoints is 8 px" in err and "got 17" in err
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize("flag, value", [("--per-class", "0"), ("--batch-size", "0"), ("--cfg-scale", "inf"),
                                         ("--cfg-scale", "0.5"), ("--temperature", "nan"), ("--top-p", "0"),
                                         ("--image-size", "-3"), ("--gsd-window", "0"), ("--gsd-gap", "1.5")])
def test_bad_counts_and_values_are_usage_errors_naming_the_argument(tmp_path, capsys, flag, value):
    with pytest.raises(SystemExit) as exit_info:
        main([*ARGS, "--classes", "1", flag, value, "--out", str(tmp_path / "a")])
    assert exit_info.value.code == 2
    assert f"argument {flag}: expected" in capsys.readouterr().err


def test_sample_images_compile_writes_the_same_images(tmp_path, monkeypatch):
    monkeypatch.setattr("specmm.core.compiled.BACKEND", "eager")  # dynamo capture, no kernel codegen
    outs = [tmp_path / "eager", tmp_path / "compiled"]
    for out, flag in zip(outs, ([], ["--compile"])):
        assert main([*ARGS, "--classes", "1", "--method", "ar", "--out", str(out), *flag]) == 0
    assert pngs(outs[0]) == pngs(outs[1]) and len(pngs(outs[1])) == 2


def test_dtype_puts_the_llamagen_gpt_in_it_and_the_job_records_it(tmp_path, monkeypatch):
    """--dtype bfloat16: the sampler's GPT (and so its drafter) runs in bf16, the VQ decoder in float32; float32
    jobs keep the settings they had before (no dtype key), so their resumes still match."""
    import torch

    import specmm.image_ar.methods as methods

    seen = []
    real = methods.make_sampler
    monkeypatch.setattr(methods, "make_sampler", lambda model, *a, **kw: seen.append(model) or real(model, *a, **kw))
    out = tmp_path / "bf16"
    assert main([*ARGS, "--classes", "1", "--method", "sjd", "--dtype", "bfloat16", "--out", str(out)]) == 0
    lg = seen[-1]
    assert lg.gpt.tok_embeddings.weight.dtype == torch.bfloat16 and next(lg.vq.parameters()).dtype == torch.float32
    assert json.loads((out / "job.json").read_text())["settings"]["dtype"] == "torch.bfloat16"
    assert len(pngs(out)) == 2
    assert main([*ARGS, "--classes", "1", "--method", "sjd", "--out", str(tmp_path / "f32")]) == 0
    assert "dtype" not in json.loads((tmp_path / "f32" / "job.json").read_text())["settings"]


def test_a_config_file_edited_in_place_is_another_job(tmp_path, capsys):
    """LlamaGen configs given as files are recorded by content: the same path with another rope_base (other
    images) refuses to resume."""
    config = tmp_path / "gpt.json"
    config.write_text((FIXTURES / "gpt_c2i_config.json").read_text())
    args = [*ARGS, "--classes", "1", "--per-class", "1", "--method", "ar", "--out", str(tmp_path / "out")]
    args[args.index("--gpt-config") + 1] = str(config)
    assert main(args) == 0
    config.write_text(config.read_text().replace('"rope_base": 10000', '"rope_base": 500'))
    capsys.readouterr()
    assert main([*args, "--resume"]) == 2
    assert "gpt_config: " in capsys.readouterr().err
