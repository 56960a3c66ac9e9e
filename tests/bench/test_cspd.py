"""`specmm bench cspd` on the tiny zoo build: every method completes every token; reports carry the noise floor."""

from __future__ import annotations

import json

import pytest

from specmm import zoo
from specmm.bench.cspd import CSpDBenchSetup, bench_cspd
from specmm.cli import main
from specmm.zoo import cspd


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECMM_HOME", str(tmp_path_factory.mktemp("home")))
        yield cspd.load(zoo.build("cspd", "tiny", progress=False))


def test_bench_rows_cover_baseline_noise_floor_and_each_rule(models, tmp_path):
    setup = CSpDBenchSetup(images=4, batch_size=4, draft_tokens=(2,), rules=("trajectory", "final-step"))
    partial = []
    report, images = bench_cspd(models, setup, command="test", description={}, grid_path=tmp_path / "grid.png",
                                progress=False, checkpoint=partial.append)
    names = [row.method for row in report.rows]
    # a report after each timed round (timings only), then the whole one
    assert [p.partial[:6] for p in partial] == ["1 of 1"] and report.partial == ""
    assert [r.method for r in partial[0].rows] == names and "FID vs AR" not in partial[0].rows[1].extra
    assert names[0] == "target-only AR" and "noise floor" in names[1] and "draft-only" in names[2] and len(names) == 5
    tokens = models["target"].config.num_tokens
    assert all(row.new_tokens == 4 * tokens for row in report.rows)
    assert all(row.mean_accepted >= 1.0 for row in report.rows[3:])
    assert report.rows[1].mean_accepted is None and report.rows[2].mean_accepted is None
    assert all("FID vs AR" in row.extra for row in report.rows[1:]) and (tmp_path / "grid.png").is_file()
    assert all(pictures.shape == (4, 3, 16, 16) for pictures in images.values())


def test_cli_rejects_bad_arguments_before_work(capsys):
    assert main(["bench", "cspd", "--scale", "tiny", "--images", "1"]) == 2
    assert "images" in capsys.readouterr().err


def test_cli_writes_the_report(models, tmp_path, monkeypatch):  # the fixture's SPECMM_HOME holds the tiny build
    import torch

    real_compile = torch.compile  # --compile-heads: dynamo's graphs, no inductor codegen (seconds of the suite's time)
    monkeypatch.setattr(torch, "compile", lambda fn, **options: real_compile(fn, backend="eager"))
    out = tmp_path / "reports"
    assert main(["bench", "cspd", "--scale", "tiny", "--images", "2", "--batch-size", "2", "--k", "2", "--rules",
                 "trajectory", "--compile-heads", "--out", str(out), "--name", "t"]) == 0
    data = json.loads((out / "t.json").read_text())
    assert data["rows"][0]["method"] == "target-only AR" and (out / "t-grid.png").is_file()
    assert data["setup"]["denoising chains"].startswith("torch.compile")
