"""`specmm sample-continuous` on the tiny zoo `cspd` build: PNGs per image, resume keeps finished images, bad input
fails before any sampling."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from specmm import zoo
from specmm.cli import main


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECMM_HOME", str(tmp_path_factory.mktemp("home")))
        yield zoo.build("cspd", "tiny", progress=False)


def args(folder, out, *extra):
    return ["sample-continuous", "--target", str(folder / "target"), "--vae", str(folder / "vae"), "--classes", "0,2",
            "--per-class", "3", "--batch-size", "2", "--out", str(out), *extra]


def test_cspd_writes_every_image_and_resume_samples_only_the_missing_ones(folder, tmp_path):
    out = tmp_path / "images"
    assert main(args(folder, out, "--draft", str(folder / "draft"), "--k", "2")) == 0
    pngs = sorted(out.glob("class*.png"))
    assert [p.name for p in pngs] == [f"class{c:04d}_{i:03d}.png" for c in (0, 2) for i in range(3)]
    assert Image.open(pngs[0]).size == (16, 16) and (out / "grid.png").is_file()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["sampled_now"] == 6 and summary["mean_accepted_now"] >= 1.0

    kept = {p.name: p.read_bytes() for p in pngs[1:]}
    first = pngs[0].read_bytes()
    pngs[0].unlink()
    assert main(args(folder, out, "--draft", str(folder / "draft"), "--k", "2", "--resume")) == 0
    assert json.loads((out / "summary.json").read_text())["sampled_now"] == 1
    assert all((out / name).read_bytes() == data for name, data in kept.items()) and pngs[0].is_file()
    assert pngs[0].read_bytes() == first  # its batch is re-sampled: the very image of the uninterrupted run


def test_target_alone(folder, tmp_path):
    assert main(args(folder, tmp_path / "ar")) == 0
    assert json.loads((tmp_path / "ar" / "summary.json").read_text())["method"] == "ar"


@pytest.mark.parametrize("extra, message", [
    (["--classes", "0,99"], "--classes"),
    (["--draft", "/nonexistent"], "--draft: /nonexistent does not exist"),
])
def test_bad_input_fails_before_sampling(folder, tmp_path, capsys, extra, message):
    out = tmp_path / "bad"
    assert main(args(folder, out) + extra) == 2
    assert message in capsys.readouterr().err and not any(out.glob("*.png"))


def test_existing_images_need_resume(folder, tmp_path, capsys):
    out = tmp_path / "images"
    out.mkdir()
    Image.new("RGB", (16, 16)).save(out / "class0000_000.png")
    assert main(args(folder, out)) == 2
    assert "--resume" in capsys.readouterr().err
