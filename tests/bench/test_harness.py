"""The benchmark harness compares honestly: same inputs, speedup against the first method, output check."""

from __future__ import annotations

import json

import pytest
import torch

from specmm.bench.core import CoreBenchSetup, bench_core
from specmm.bench.harness import BenchReport, Method, RunResult, run_benchmark
from specmm.bench.harness import distinct_ngram_share, repetition_note
from specmm.cli import main
from tests.conftest import left_padded_batch, perturbed_copy, tiny_model


def test_speedup_is_relative_to_the_first_method_and_mismatches_are_flagged():
    import time

    def slow():
        time.sleep(0.02)
        return RunResult([[1, 2, 3]])

    def fast():
        return RunResult([[1, 2, 3]], mean_accepted=3.0)

    rows, outputs = run_benchmark(
        [Method("base", slow), Method("fast", fast), Method("wrong", lambda: RunResult([[9]]))],
        torch.device("cpu"), repeats=2, warmup=1, progress=False)
    assert rows[0].speedup == 1.0 and rows[1].speedup > 2.0
    assert [r.matched for r in rows] == [True, True, False]
    assert rows[1].mean_accepted == 3.0 and outputs["wrong"].rows == [[9]]


def test_core_bench_runs_every_method_on_the_same_inputs_and_they_match(tmp_path):
    target = tiny_model("llama", dtype=torch.float32)
    draft = perturbed_copy(target, 0.3)
    ids, mask = left_padded_batch([4, 7], seed=3)
    setup = CoreBenchSetup(max_new_tokens=12, k=3, repeats=1, warmup=0)
    report, outputs = bench_core(target, draft, ids, mask, setup, command="test", models={}, notes=["n"],
                                 progress=False)
    names = [r.method for r in report.rows]
    assert any("HF assisted" in n for n in names) and any("tree" in n for n in names)
    assert all(r.matched for r in report.rows), report.table()
    assert all(len(row) == 12 for row in outputs[names[0]].rows)
    json_path, md_path = report.write(tmp_path, "core-test")
    assert json.loads(json_path.read_text())["rows"][0]["speedup"] == 1.0
    assert "| method | tokens/s |" in md_path.read_text()


def test_cli_bench_on_random_models_writes_reports(tmp_path, capsys):
    code = main(["bench", "core", "--random", "--batch-size", "2", "--max-new-tokens", "6", "--repeats", "1",
                 "--out", str(tmp_path), "--name", "r"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "meaningless" in printed and (tmp_path / "r.json").is_file() and (tmp_path / "r.md").is_file()
    assert all(row["matched"] for row in json.loads((tmp_path / "r.json").read_text())["rows"])


def test_cli_reports_bad_arguments_as_errors(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECMM_HOME", str(tmp_path))
    assert main(["zoo", "path", "code", "--scale", "tiny"]) == 2
    assert "specmm zoo build code" in capsys.readouterr().err
    assert main(["zoo", "build", "nope"]) == 2


def test_the_checkpoint_sees_the_table_after_every_timed_round():
    """Medians of the rounds run so far, a failing method as a failed row, nothing before the warm-up ends."""
    durations = iter([0.0, 0.03, 0.01])  # base's sleep in the warm-up round, then in two timed rounds
    import time

    def base():
        time.sleep(next(durations))
        return RunResult([[1, 2]])

    def broken():
        raise RuntimeError("no")

    seen = []
    rows, _ = run_benchmark([Method("base", base, baseline=True), Method("fast", lambda: RunResult([[1, 2]])),
                             Method("broken", broken)], torch.device("cpu"), repeats=2, warmup=1, progress=False,
                            checkpoint=lambda table, outputs: seen.append((table, sorted(outputs))))
    assert len(seen) == 2 and all(names == ["base", "fast"] for _, names in seen)
    first, second = seen[0][0], seen[1][0]
    assert first[0].median_s >= 0.03 and second[0].median_s < first[0].median_s  # the median of 0.03 and 0.01
    assert [r.error is not None for r in second] == [False, False, True] and second[0].speedup_vs_best_ar == 1.0
    assert [r.method for r in rows] == [r.method for r in second]


def test_a_killed_bench_leaves_a_partial_report(tmp_path, monkeypatch):
    """A run killed after its first timed round still has that round's table on disk, marked partial; a whole
    run's report carries no mark."""
    import specmm.bench.harness as harness

    timed = harness._timed

    def killed_after_the_first_report(fn, device):
        if (tmp_path / "r.md").is_file():
            raise KeyboardInterrupt  # what a timeout's SIGTERM handler or Ctrl-C raises
        return timed(fn, device)

    monkeypatch.setattr(harness, "_timed", killed_after_the_first_report)
    argv = ["bench", "core", "--random", "--batch-size", "2", "--max-new-tokens", "4", "--repeats", "2",
            "--out", str(tmp_path), "--name", "r"]
    assert main(argv) == 130  # Ctrl-C: one line, exit 130
    text = (tmp_path / "r.md").read_text()
    assert "**Partial report:** 1 of 2 timed rounds run" in text and "| method | tokens/s |" in text
    assert json.loads((tmp_path / "r.json").read_text())["partial"].startswith("1 of 2")
    monkeypatch.setattr(harness, "_timed", timed)
    assert main(argv) == 0
    assert "Partial" not in (tmp_path / "r.md").read_text()
    assert json.loads((tmp_path / "r.json").read_text())["partial"] == ""


def test_a_failing_method_becomes_a_failed_row_but_the_reference_must_run():
    def broken():
        raise RuntimeError("index out of bounds")

    rows, outputs = run_benchmark([Method("base", lambda: RunResult([[1]]), baseline=True), Method("broken", broken),
                                   Method("fine", lambda: RunResult([[1]], mean_accepted=1.0))],
                                  torch.device("cpu"), repeats=1, warmup=1, progress=False)
    assert rows[1].error == "RuntimeError: index out of bounds" and rows[1].matched is False
    assert "broken" not in outputs and rows[2].matched and rows[1].speedup_vs_best_ar is None
    report = BenchReport(name="t", command="c", rows=rows, setup={})
    assert "| broken | FAILED: RuntimeError: index out of bounds |" in report.table()
    assert "FAILED (the method raised" in report.markdown()
    with pytest.raises(RuntimeError, match="index out of bounds"):
        run_benchmark([Method("base", broken)], torch.device("cpu"), repeats=1, warmup=0, progress=False)


def test_a_failed_row_resets_the_cuda_graphs_and_a_bare_assert_says_where(monkeypatch):
    """A row that raises inside a CUDA-graphed call leaves the graph trees broken for every later row (seen on an
    H100: every compiled row after the first failure, HF's own included, failed with a bare AssertionError)."""
    resets = []
    monkeypatch.setattr("specmm.bench.harness.reset_graphs", lambda: resets.append(1))

    def bare_assert():
        raise AssertionError  # message-less, as torch's graph trees raise it

    rows, _ = run_benchmark([Method("base", lambda: RunResult([[1]]), baseline=True), Method("asserts", bare_assert)],
                            torch.device("cpu"), repeats=1, warmup=1, progress=False)
    assert resets == [1]
    assert rows[1].error.startswith("AssertionError: raised at test_harness.py:")



@pytest.mark.parametrize("rows, share", [
    ([[1, 2, 3, 4, 5, 6]], 1.0),  # 3 distinct 4-grams of 3
    ([[7, 8, 7, 8, 7, 8, 7, 8]], 2 / 5),  # a loop: 2 distinct of 5
    ([[1, 2, 3, 4], [5, 5, 5, 5, 5]], (1.0 + 0.5) / 2),  # mean over rows
    ([[1, 2]], 1.0),  # nothing to judge
])
def test_distinct_ngram_share_table(rows, share):
    assert distinct_ngram_share(rows) == pytest.approx(share)


def test_repetition_note_only_for_output_that_loops():
    assert repetition_note(0.5) is None
    assert "0.02" in repetition_note(0.02) and "--no-repeat-ngram-size" in repetition_note(0.02)


def test_bench_core_no_repeat_ngram_size_reaches_every_row(tmp_path, capsys):
    """`--no-repeat-ngram-size` is the target's generation_config: HF generate and the specmm rows (which must still
    match it) decode without a repeated n-gram, and the report says so."""
    assert main(["bench", "core", "--random", "--device", "cpu", "--batch-size", "2", "--max-new-tokens", "24",
                 "--repeats", "1", "--warmup", "1", "--no-repeat-ngram-size", "2", "--out", str(tmp_path)]) == 0
    report = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert report["setup"]["no_repeat_ngram_size"] == 2
    assert report["setup"]["target output: distinct 4-gram share"] == 1.0
    assert all(row["matched"] for row in report["rows"] if row["matched"] is not None)


def test_core_bench_rows_per_drafter_match_and_hf_assisted_needs_the_draft_model():
    """Each extra drafter (an EAGLE head here) gets its own chain and tree rows, which must match plain decoding;
    without a draft model there are no code-draft rows and no HF assisted row."""
    from specmm.bench.inputs import eagle_factory
    from specmm.drafters import EagleDrafter

    torch.manual_seed(0)
    target = tiny_model("llama", dtype=torch.float32)
    ids, mask = left_padded_batch([4, 7], seed=3)
    setup = CoreBenchSetup(max_new_tokens=10, k=3, repeats=1, warmup=0)
    drafters = {"eagle": eagle_factory(EagleDrafter.for_target(target), target)}
    report, _ = bench_core(target, None, ids, mask, setup, command="test", models={}, notes=[], progress=False,
                           drafters=drafters)
    names = [r.method for r in report.rows]
    assert "specmm eagle chain k=3" in names and any(n.startswith("specmm eagle tree dynamic(") for n in names)
    assert not any("assisted" in n or n.startswith("specmm chain") for n in names)
    assert all(r.matched for r in report.rows), report.table()


@pytest.mark.parametrize("argv, message", [
    (["--random", "--drafts", "eagle"], "--drafts: picks the zoo's drafters"),
    (["--eagle", "somewhere"], "--eagle: needs --target"),
])
def test_cli_bench_core_refuses_drafters_its_source_cannot_have(tmp_path, capsys, argv, message):
    assert main(["bench", "core", *argv, "--device", "cpu", "--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err and list(tmp_path.iterdir()) == []
