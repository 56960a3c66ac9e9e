"""`specmm bench reasoning` machinery on the tiny zoo build: every row, exactness flags and the plot."""

from __future__ import annotations

import json

import pytest
import torch

from specmm import zoo
from specmm.bench.reasoning import ReasoningBenchSetup, bench_reasoning, write
from specmm.zoo import chainarith
from tests.conftest import one_torch_thread


@pytest.fixture
def tiny_models(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECMM_HOME", str(tmp_path / "home"))
    with one_torch_thread():
        yield chainarith.load(zoo.build("chainarith", "tiny", progress=False))


def test_bench_reports_every_method_and_token_sd_reproduces_target_only(tiny_models, tmp_path):
    setup = ReasoningBenchSetup(batch_sizes=(1, 3), problems={1: 2, 3: 3}, specreason_thresholds=(4.5,),
                                arbitrage_thresholds=(0.5,), max_new_tokens=16, max_step_tokens=6)
    reports, results = bench_reasoning(tiny_models, setup, command="test", description={}, device=torch.device("cpu"),
                                       progress=False)
    for rows in results.values():
        names = [r.name for r in rows]
        assert names[:2] == ["target-only", "draft-only"]
        assert any(n.startswith("specreason") for n in names) and any(n.startswith("arbitrage") for n in names)
        token_sd = next(r for r in rows if r.name.startswith("token-level"))
        assert token_sd.completions == rows[0].completions  # greedy exact SD = the target's own tokens
        randoms = [r for r in rows if r.name.startswith("random")]
        assert len(randoms) == 2 and all("[matches" in r.name for r in randoms)
        assert all(0.0 <= r.accuracy <= 1.0 and r.wall_s > 0 for r in rows)
    assert [r.method for r in reports[0].rows if r.baseline] == ["target-only"]
    assert not any(r.compiled for r in reports[0].rows)  # eager unless setup.compile
    table = reports[0].table()
    assert "accuracy" in table and "within 1 SE of target" in table
    json_path, md_path, png = write(reports, results, tmp_path, "reasoning-test")
    assert png.stat().st_size > 1000 and "![accuracy vs latency]" in md_path.read_text()
    assert set(json.loads(json_path.read_text())["results"]) == {"1", "3"}
