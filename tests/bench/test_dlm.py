"""`specmm bench dlm` on the tiny zoo entry: SSD matches stepwise per cache mode, forwards are counted."""

from __future__ import annotations

import json

import pytest
import torch

from specmm.bench.dlm import DLMBenchSetup, bench_dlm_zoo
from specmm.cli import main
from tests.conftest import one_torch_thread


@pytest.fixture(autouse=True)
def one_thread():
    with one_torch_thread():
        yield


def test_bench_dlm_reports_ssd_identical_to_stepwise(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECMM_HOME", str(tmp_path / "home"))
    setup = DLMBenchSetup(prompts=4, batch_size=2, gen_length=16, block_length=8, draft_size=4, tree_width=2,
                          repeats=1, warmup=0)
    from specmm.bench import dlm

    written, real = [], dlm.write_reports
    monkeypatch.setattr(dlm, "write_reports", lambda reports, *a: written.append([r.partial[:6] for r in reports])
                        or real(reports, *a))
    reports, (json_path, md_path) = bench_dlm_zoo("tiny", setup, torch.device("cpu"), torch.float32,
                                                  command="test", out=tmp_path / "out", progress=False)
    assert [r.setup["cache"] for r in reports] == ["none", "prefix"]
    assert written == [["1 of 1"], ["", "1 of 1"], ["", ""]]  # after each timed round, then the whole report
    for report in reports:
        rows = {r.method: r for r in report.rows}
        assert rows["stepwise"].extra["forwards"] == 16 * 2  # two batches, one token per forward
        for name, row in rows.items():
            if name.startswith("ssd"):
                assert row.matched and row.extra["forwards"] <= 32 and row.mean_accepted >= 1.0
        assert "code-LM NLL" in rows["stepwise"].extra
    assert len(json.loads(json_path.read_text())) == 2 and "ssd chain N=4" in md_path.read_text()


def test_cli_rejects_bad_cache_names(capsys):
    assert main(["bench", "dlm", "--caches", "dual"]) == 2
    assert "--caches" in capsys.readouterr().err
