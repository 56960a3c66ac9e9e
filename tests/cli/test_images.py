"""`specmm sample-images` on upstream-layout checkpoints: PNGs, a grid, resume, and clear errors."""

from pathlib import Path

import pytest

from specmm.cli import main

FIXTURES = Path("/work/shared/fixtures/llamagen")
pytestmark = pytest.mark.skipif(not FIXTURES.is_dir(), reason="LlamaGen fixtures not available")
ARGS = ["sample-images", "--gpt-ckpt", str(FIXTURES / "gpt_c2i.pt"), "--vq-ckpt", str(FIXTURES / "vq.pt"),
        "--gpt-config", str(FIXTURES / "gpt_c2i_config.json"), "--vq-config", str(FIXTURES / "vq_config.json"),
        "--image-size", "8", "--top-k", "16", "--cfg-scale", "2.0", "--per-class", "2", "--batch-size", "3"]


def test_sample_images_writes_pngs_grid_and_resumes(tmp_path):
    out = tmp_path / "images"
    assert main([*ARGS, "--classes", "1,2", "--method", "sjd", "--out", str(out)]) == 0
    pngs = sorted(p.name for p in out.glob("class*.png"))
    assert pngs == ["class0001_000.png", "class0001_001.png", "class0002_000.png", "class0002_001.png"]
    assert (out / "grid.png").is_file()
    (out / "class0002_001.png").unlink()
    assert main([*ARGS, "--classes", "1,2", "--method", "gsd", "--out", str(out)]) == 2  # exists, no --resume
    assert main([*ARGS, "--classes", "1,2", "--method", "gsd", "--out", str(out), "--resume"]) == 0
    assert (out / "class0002_001.png").is_file()


def test_sample_images_errors(tmp_path, capsys):
    assert main([*ARGS, "--classes", "1,10", "--method", "sjd", "--out", str(tmp_path / "a")]) == 2
    assert "--classes" in capsys.readouterr().err
    assert main([*ARGS, "--classes", "1", "--method", "lantern", "--out", str(tmp_path / "b")]) == 2
    assert "drafter" in capsys.readouterr().err
