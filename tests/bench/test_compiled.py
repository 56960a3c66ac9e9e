"""Compiled rows in the benchmarks: HF's static + compiled baseline, compile time apart, speedup vs the best AR.

One test compiles (tiny models, a few seconds per shape); the others check the report logic on made-up rows.
"""

from __future__ import annotations

import json

import pytest
import torch

import specmm
from specmm.bench.core import CoreBenchSetup, bench_core
from specmm.bench.harness import Method, RunResult, round_ms, run_benchmark
from specmm.bench.report import PHASE_LABELS, BenchRow, compare_with_best_ar
from specmm.cli import build_parser
from specmm.cli.bench import modes
from specmm.core.stats import GenerationStats
from tests.conftest import left_padded_batch, one_torch_thread, perturbed_copy, tiny_model


def _row(name, speedup, accepted=None, baseline=False):
    return BenchRow(method=name, tokens_per_s=100 * speedup, speedup=speedup, mean_accepted=accepted, matched=True,
                    new_tokens=10, median_s=0.1 / speedup, baseline=baseline)


def test_speedup_vs_best_ar_uses_the_fastest_baseline_and_efficiency_divides_by_accepted_tokens():
    rows = [_row("hf eager", 1.0, baseline=True), _row("hf compiled", 1.6, baseline=True),
            _row("assisted", 1.2), _row("specmm", 2.4, accepted=3.0)]
    best = compare_with_best_ar(rows)
    assert best is rows[1]
    assert [r.speedup_vs_best_ar for r in rows] == pytest.approx([1 / 1.6, 1.0, 1.2 / 1.6, 1.5])
    assert rows[3].overhead_efficiency == pytest.approx(0.5)  # 1.5x over the best AR from 3 tokens per forward
    assert rows[1].overhead_efficiency == pytest.approx(1.0) and rows[2].overhead_efficiency is None
    assert compare_with_best_ar([_row("x", 1.0)]) is None  # no baseline: nothing to compare with


def test_round_split_is_ms_per_target_forward_and_compiled_methods_need_a_warm_up():
    stats = GenerationStats(target_forwards=4, round_time_split={"draft": 0.004, "verify": 0.008,
                                                                 "accept_commit": 0.002, "other": 0.0})
    assert round_ms(stats) == pytest.approx({"draft": 1.0, "verify": 2.0, "accept_commit": 0.5, "other": 0.0})
    assert round_ms(GenerationStats(target_forwards=4)) == {}  # not profiled
    method = Method("c", lambda: RunResult([[1]]), compiled=True)
    with pytest.raises(ValueError, match="warmup: compiled methods"):
        run_benchmark([method], torch.device("cpu"), repeats=1, warmup=0, progress=False)


def test_profiled_runs_fill_the_split_and_never_the_timings():
    calls = []

    def run(profiled=False):
        calls.append(profiled)
        stats = GenerationStats(target_forwards=2, round_time_split=dict.fromkeys(PHASE_LABELS, 0.002) if profiled
                                else {})
        return RunResult([[1, 2]], mean_accepted=2.0, stats=stats)

    rows, _ = run_benchmark([Method("ar", lambda: RunResult([[1, 2]]), baseline=True),
                             Method("spec", run, profile=lambda: run(True))],
                            torch.device("cpu"), repeats=2, warmup=1, progress=False)
    assert calls == [False, False, False, True]  # warm-up, two timed runs, then one profiled run
    assert rows[1].round_ms == pytest.approx(dict.fromkeys(PHASE_LABELS, 1.0)) and rows[0].round_ms == {}
    assert rows[0].baseline and not rows[1].baseline and rows[0].speedup_vs_best_ar == 1.0


def test_cli_compile_flag_selects_compiled_rows():
    parser = build_parser()
    assert modes(parser.parse_args(["bench", "core", "--compile"])) == ("eager", "compiled")
    assert modes(parser.parse_args(["bench", "vlm"])) == ("eager",)
    assert parser.parse_args(["bench", "ssm", "--compile"]).compile
    assert parser.parse_args(["bench", "reasoning", "--compile"]).compile


def test_bench_core_row_selection_keeps_only_the_asked_trees_and_profiles(tmp_path):
    """--trees, --no-lookup and --no-profile cut a GPU run's compiled rows (each compiles for about a minute)."""
    from specmm.cli import main

    assert main(["bench", "core", "--random", "--device", "cpu", "--batch-size", "1", "--max-new-tokens", "4",
                 "--repeats", "1", "--trees", "dynamic", "--no-lookup", "--no-profile", "--out", str(tmp_path),
                 "--name", "rows"]) == 0
    rows = json.loads((tmp_path / "rows.json").read_text())["rows"]
    specmm_rows = [r for r in rows if r["method"].startswith("specmm")]
    assert specmm_rows and all(" tree dynamic(" in r["method"] for r in specmm_rows)
    assert all(r["round_ms"] == {} for r in specmm_rows)  # no profiled run, so no per-round split


def test_bench_core_compile_reports_baselines_compile_time_apart_and_identical_outputs(tmp_path, capture_only):
    target = tiny_model("llama", dtype=torch.float32)
    draft = perturbed_copy(target, 0.3)
    ids, mask = left_padded_batch([4, 7], seed=3)
    setup = CoreBenchSetup(max_new_tokens=6, k=2, tree=specmm.TreeSpec.dynamic(depth=2, top_k=2, total_tokens=4),
                           repeats=1, modes=("eager", "compiled"))
    with one_torch_thread():  # the prompt-lookup rows stay eager (logged: that drafter runs no model)
        report, _ = bench_core(target, draft, ids, mask, setup, command="test", models={}, notes=[],
                               progress=False)
    json_path, md_path = report.write(tmp_path, "core-compiled")
    rows = {r["method"]: r for r in json.loads(json_path.read_text())["rows"]}
    new_fields = {"baseline", "compiled", "compile_s", "timed_compiles", "round_ms", "speedup_vs_best_ar",
                  "overhead_efficiency"}
    assert all(new_fields <= set(r) for r in rows.values())
    eager_ar = "target-only (HF generate, batch 2)"
    static_ar = "target-only (HF generate, static cache + torch.compile, batch 2)"
    assert [m for m, r in rows.items() if r["baseline"]] == [eager_ar, static_ar]
    compiled = [m for m, r in rows.items() if r["compiled"]]
    assert compiled == [static_ar] + [m for m in rows if m.endswith(", compiled")] and len(compiled) == 4
    assert all(r["matched"] for r in rows.values()), report.table()  # compiled rows: the target's own tokens
    # compile time is measured in the warm-up, and the timed runs met only compiled shapes
    assert rows[static_ar]["compile_s"] > 0 and sum(rows[m]["compile_s"] for m in compiled[1:]) > 0
    assert all(r["timed_compiles"] == 0 for r in rows.values())
    assert all(r["compile_s"] == 0 for m, r in rows.items() if m not in compiled)
    # prompt lookup runs no model, but its lookup is part of the round graph (a history of static width)
    assert rows["specmm prompt lookup k=2, compiled"]["extra"]["compiled parts"] == "target+drafter"
    assert all(rows[m]["extra"]["rounds"] == "one graph" for m in compiled[1:]), report.table()
    assert rows["specmm chain k=2, compiled"]["extra"]["compiled parts"] == "target+drafter"
    best = max((rows[eager_ar], rows[static_ar]), key=lambda r: r["speedup"])
    for r in rows.values():
        assert r["speedup_vs_best_ar"] == pytest.approx(r["speedup"] / best["speedup"])
        if not r["baseline"] and r["mean_accepted"]:
            assert r["overhead_efficiency"] == pytest.approx(r["speedup_vs_best_ar"] / r["mean_accepted"])
    assert all(set(r["round_ms"]) == set(PHASE_LABELS) for m, r in rows.items() if m.startswith("specmm"))
    assert not any(r["round_ms"] for m, r in rows.items() if not m.startswith("specmm"))
    markdown = md_path.read_text()
    assert "speedup vs best AR" in markdown and "compile s" in markdown and f"('{best['method']}')" in markdown
    assert "_compiled_call" not in target.__dict__ and "forward" not in target.__dict__  # the model is as it was
