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


def test_bench_reports_every_method_in_both_schedules_and_exact_rows_reproduce_target_only(tiny_models, tmp_path):
    setup = ReasoningBenchSetup(batch_sizes=(2,), problems={2: 3}, specreason_thresholds=(4.5,),
                                arbitrage_thresholds=(0.5,), max_new_tokens=16, max_step_tokens=6, round_batches=2)
    reports, results = bench_reasoning(tiny_models, setup, command="test", description={}, device=torch.device("cpu"),
                                       progress=False)
    for rows in results.values():
        by_name = {r.name: r for r in rows}
        names = [r.name for r in rows]
        assert names[:4] == ["target-only [lockstep]", "target-only [async, refill]",
                             "target-only (HF generate, batch 2)", "draft-only [lockstep]"]
        for exact in [n for n in names if n.startswith(("target-only", "token-level"))]:  # greedy: target's tokens
            assert by_name[exact].completions == rows[0].completions
        assert by_name["target-only (HF generate, batch 2)"].mean_accepted == 1.0  # a token per forward and row
        for name in [n for n in names if n.endswith("[lockstep]") and not n.startswith("draft-only")]:
            assert by_name[name.replace("[lockstep]", "[async, refill]")].completions == by_name[name].completions
        assert any(n.startswith("specreason") for n in names) and any(n.startswith("arbitrage") for n in names)
        randoms = [r for r in rows if r.name.startswith("random")]
        assert len(randoms) == 4 and all("[matches" in r.name for r in randoms)
        assert all(0.0 <= r.accuracy <= 1.0 and r.wall_s > 0 and r.problems_per_s > 0 for r in rows)
        assert all(0 < r.latency_per_problem_s <= r.wall_s for r in rows)
        step_level = [r for r in rows if "[core" not in r.name and "HF generate" not in r.name]
        assert all(0 < r.time_share["target"] + r.time_share["draft"] <= 1 for r in step_level)
        assert by_name["draft-only [lockstep]"].time_share["target"] == 0
    assert [r.method for r in reports[0].rows if r.baseline] == [
        "target-only [lockstep]", "target-only [async, refill]", "target-only (HF generate, batch 2)"]
    assert not any(r.compiled for r in reports[0].rows)  # eager unless setup.compile
    table = reports[0].table()
    for column in ("accuracy", "within 1 SE of target", "problems/s", "latency/problem s", "time % draft / target"):
        assert column in table
    json_path, md_path, png = write(reports, results, tmp_path, "reasoning-test")
    assert png.stat().st_size > 1000 and "![accuracy vs latency]" in md_path.read_text()
    assert set(json.loads(json_path.read_text())["results"]) == {"2"}


def test_a_run_stopped_after_its_first_batch_size_keeps_that_report_marked_partial(tiny_models, tmp_path):
    """The report is written after every batch size: a GPU run cut off by its time limit during batch 256 must
    still return batch 64's rows, saying that 256 is missing."""
    setup = ReasoningBenchSetup(batch_sizes=(1, 2), problems={1: 1, 2: 2}, specreason_thresholds=(4.5,),
                                arbitrage_thresholds=(0.5,), max_new_tokens=8, max_step_tokens=4, round_batches=1)

    class Stopped(Exception):
        pass

    def write_then_stop(reports, results):
        write(reports, results, tmp_path, "partial", pending=setup.batch_sizes[len(reports):])
        raise Stopped  # the time limit, right after the first batch size

    with pytest.raises(Stopped):
        bench_reasoning(tiny_models, setup, command="test", description={}, device=torch.device("cpu"),
                        progress=False, on_batch=write_then_stop)
    data = json.loads((tmp_path / "partial.json").read_text())
    assert data["pending_batch_sizes"] == [2] and set(data["results"]) == {"1"}
    assert (tmp_path / "partial.md").read_text().startswith("**Partial report:** batch sizes 2 have not run yet.")


def test_the_hf_static_baseline_compiles_hfs_decode_step_and_reproduces_eager_generate(tiny_models):
    """`--compile`'s plain-decoding baseline: HF `generate` over a static cache with its decode step compiled (graph
    capture here), the same completions as eager HF `generate`, and the row says it ran compiled."""
    from specmm.bench.fast_path import hf_compile_scope
    from specmm.bench.reasoning import Tally, hf_generate_method

    setup = ReasoningBenchSetup(max_new_tokens=16, compile=True)
    problems = tiny_models.heldout_problems(3)
    tallies = {static: Tally() for static in (False, True)}
    with hf_compile_scope(tiny_models.target):
        for static, tally in tallies.items():
            hf_generate_method(tiny_models, setup, torch.device("cpu"), 2, static)(problems, 0, tally)
    assert tallies[True].completions == tallies[False].completions and len(tallies[True].completions) == 3
    assert tallies[True].compiled and not tallies[False].compiled
    assert tallies[True].stats.new_tokens == sum(len(row) for row in tallies[True].completions)
    assert "_compiled_call" not in tiny_models.target.__dict__  # the scope left the model as it was
