"""`specmm bench ssm` machinery on tiny random models: every method runs, reproduces AR, and the report writes."""

from __future__ import annotations

import json

import pytest
import torch

import specmm
from specmm.bench.report import PHASE_LABELS
from specmm.bench.ssm import SSMBenchSetup, bench_ssm
from tests.conftest import left_padded_batch
from tests.ssm.conftest import aligned_drafter_model, one_cpu_thread, tiny_ssm  # noqa: F401 (autouse)


def test_bench_ssm_runs_every_method_side_by_side_and_writes_the_report(tmp_path):
    target = tiny_ssm("bamba", dtype=torch.float64)
    draft = aligned_drafter_model(target)
    ids, mask = left_padded_batch([4, 7], vocab=target.config.vocab_size, seed=3)
    setup = SSMBenchSetup(max_new_tokens=6, k=(2, 3), dynamic=specmm.TreeSpec.dynamic(depth=3, top_k=2,
                                                                                      total_tokens=6),
                          repeats=1, warmup=0, profile=False)
    partial = []
    report, _outputs = bench_ssm(target, draft, ids, mask, setup, name="t", command="specmm bench ssm", models={},
                                notes=[], progress=False, checkpoint=partial.append)
    assert [r.method.split(",")[0] for r in report.rows[:5]] == ["AR (HF generate", *["chain SD k=2"] * 2,
                                                                 *["chain SD k=3"] * 2]  # a chain pair per length
    assert [r.method.split()[0] for r in report.rows[5:]] == ["STree", "STree"]
    assert [p.partial[:6] for p in partial] == ["1 of 1"] and report.partial == ""
    assert [r.method for r in partial[0].rows] == [r.method for r in report.rows]
    assert all(r.matched for r in report.rows), report.table()
    assert all(r.mean_accepted > 1.0 for r in report.rows[1:])
    assert [r.baseline for r in report.rows] == [True] + [False] * 6
    assert not any(r.compiled for r in report.rows) and report.rows[0].speedup_vs_best_ar == 1.0
    json_path, md_path = report.write(tmp_path, "ssm")
    assert json.loads(json_path.read_text())["rows"][0]["speedup"] == 1.0
    assert "replay rollback" in md_path.read_text()


def test_bench_ssm_compiled_rows_report_both_ar_baselines_and_compile_time_apart(tmp_path, capture_only):
    """`bench ssm --compile` machinery: HF eager and static+compiled AR baselines, every speculative row compiled
    (target and draft) with AR's tokens, compile seconds from the warm-up only, and the per-round split."""
    target = tiny_ssm("mamba2", dtype=torch.float32)
    draft = aligned_drafter_model(target, residual_scale=16.0)
    ids, mask = left_padded_batch([4, 7], vocab=target.config.vocab_size, seed=3)
    # three nodes at depth 2 in every row: one verify shape and the same draft shapes, compiled once
    same_shapes = dict(k=(2,), static=specmm.TreeSpec.static([[0], [0, 0]]),
                       dynamic=specmm.TreeSpec.dynamic(depth=2, top_k=1, total_tokens=3))
    setup = SSMBenchSetup(max_new_tokens=6, repeats=1, warmup=1, modes=("compiled",), **same_shapes)
    report, _outputs = bench_ssm(target, draft, ids, mask, setup, name="t", command="specmm bench ssm --compile",
                                 models={}, notes=[], progress=False)
    json_path, md_path = report.write(tmp_path, "ssm-compiled")
    rows = {r["method"]: r for r in json.loads(json_path.read_text())["rows"]}
    eager_ar, static_ar = "AR (HF generate, batch 2)", "AR (HF generate, static cache + torch.compile, batch 2)"
    assert [m for m, r in rows.items() if r["baseline"]] == [eager_ar, static_ar]
    speculative = [m for m in rows if not rows[m]["baseline"]]
    assert len(speculative) == 4 and all(m.endswith(", compiled") for m in speculative)
    assert all(r["matched"] for r in rows.values()), report.table()
    assert all(rows[m]["compiled"] and rows[m]["extra"]["compiled parts"] == "target+drafter" for m in speculative)
    assert rows[static_ar]["compiled"] and rows[static_ar]["compile_s"] > 0 and not rows[eager_ar]["compiled"]
    assert all(r["timed_compiles"] == 0 for r in rows.values())  # the warm-up compiled every shape
    assert all(set(rows[m]["round_ms"]) == set(PHASE_LABELS) for m in speculative)
    best = max((rows[eager_ar], rows[static_ar]), key=lambda r: r["speedup"])
    assert all(r["speedup_vs_best_ar"] == pytest.approx(r["speedup"] / best["speedup"]) for r in rows.values())
    assert "speedup vs best AR" in md_path.read_text()
    assert "_compiled_call" not in target.__dict__  # HF's compiled decode step is not left on the model


def test_bench_ssm_runs_each_speculative_row_once_per_draft_and_labels_them():
    target = tiny_ssm("mamba2", dtype=torch.float64)
    drafts = {"code": aligned_drafter_model(target), "distilled": aligned_drafter_model(target, residual_scale=16.0)}
    ids, mask = left_padded_batch([5, 3], vocab=target.config.vocab_size, seed=1)
    setup = SSMBenchSetup(max_new_tokens=5, k=(2,), dynamic=specmm.TreeSpec.dynamic(depth=2, top_k=2, total_tokens=4),
                          repeats=1, warmup=0, profile=False)
    report, _ = bench_ssm(target, drafts, ids, mask, setup, name="t", command="specmm bench ssm", models={}, notes=[],
                          progress=False)
    names = [r.method for r in report.rows]
    assert names[0].startswith("AR") and len(names) == 9
    assert [n.endswith("[code draft]") for n in names[1:]] == [True] * 4 + [False] * 4
    assert all(n.endswith("[distilled draft]") for n in names[5:])
    assert all(r.matched for r in report.rows), report.table()
    assert [n.removesuffix(" [code draft]") for n in names[1:5]] == [n.removesuffix(" [distilled draft]")
                                                                       for n in names[5:]]
