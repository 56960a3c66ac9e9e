"""`specmm bench ssm` machinery on tiny random models: every method runs, reproduces AR, and the report writes."""

from __future__ import annotations

import json

import torch

import specmm
from specmm.bench.ssm import SSMBenchSetup, bench_ssm
from tests.conftest import left_padded_batch
from tests.ssm.conftest import aligned_drafter_model, one_cpu_thread, tiny_ssm  # noqa: F401 (autouse)


def test_bench_ssm_runs_every_method_side_by_side_and_writes_the_report(tmp_path):
    target = tiny_ssm("bamba", dtype=torch.float64)
    draft = aligned_drafter_model(target)
    ids, mask = left_padded_batch([4, 7], vocab=target.config.vocab_size, seed=3)
    setup = SSMBenchSetup(max_new_tokens=6, k=2, dynamic=specmm.TreeSpec.dynamic(depth=3, top_k=2, total_tokens=6),
                          repeats=1, warmup=0)
    report, _outputs = bench_ssm(target, draft, ids, mask, setup, name="t", command="specmm bench ssm", models={},
                                notes=[], progress=False)
    assert [r.method.split()[0] for r in report.rows] == ["AR", "chain", "chain", "STree", "STree"]
    assert all(r.matched for r in report.rows), report.table()
    assert all(r.mean_accepted > 1.0 for r in report.rows[1:])
    assert [r.baseline for r in report.rows] == [True, False, False, False, False]
    assert not any(r.compiled for r in report.rows) and report.rows[0].speedup_vs_best_ar == 1.0
    json_path, md_path = report.write(tmp_path, "ssm")
    assert json.loads(json_path.read_text())["rows"][0]["speedup"] == 1.0
    assert "replay rollback" in md_path.read_text()
