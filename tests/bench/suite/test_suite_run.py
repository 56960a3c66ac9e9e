"""The tiny CPU run of the whole suite (issue 19's CI run): every step builds, benches and writes its reports;
`--resume` then skips every step, and `--only core` after deleting core's reports reruns core alone."""

from __future__ import annotations

import json

import pytest

from specmm.bench.suite import STEPS, step_done
from specmm.bench.suite.figures import TINY_WARNING
from specmm.cli import main
from tests.conftest import one_torch_thread


def _mtimes(folder):
    return {p.name: p.stat().st_mtime_ns for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")}


@pytest.fixture
def suite_out(tiny_zoo, tmp_path, capsys):
    """The tiny suite's output folder after one full run (the session's tiny zoo, under a temporary $SPECMM_HOME)."""
    out = tmp_path / "suite"
    with one_torch_thread():
        assert main(["bench", "suite", "--device", "cpu", "--scale", "tiny", "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    return out


def test_tiny_suite_runs_every_step_then_resumes_and_reruns_only_core(suite_out, capsys):
    out = suite_out
    for step in STEPS.values():
        assert step_done(out, step), step.name
        record = json.loads((out / f"{step.name}.json").read_text())
        assert record["figures_meaningful"] is False and record["scale"] == "tiny"
        assert TINY_WARNING in (out / f"{step.name}.md").read_text()
        assert any(name.endswith(".json") and name != f"{step.name}.json" for name in record["files"]), step.name
        assert record["rows"] and all("tokens_per_s" in r or "error" in r for r in record["rows"])
        # every speculative row's overhead efficiency is its speedup over the best AR over its mean accepted
        for row in record["rows"]:
            if row.get("overhead_efficiency") is not None:
                assert row["overhead_efficiency"] == pytest.approx(row["speedup_vs_best_ar"] / row["mean_accepted"])
        assert [b["target"] for b in record["bandwidth"]] == [t.label for t in step.targets("tiny")]
        assert all(b["bandwidth_fraction"] is None for b in record["bandwidth"])  # no GPU: no peak bandwidth
    assert (out / "reasoning-bench.png").is_file() and (out / "cspd-bench-grid.png").is_file()
    assert not (out / ".staging").exists()
    summary = (out / "README.md").read_text()
    assert TINY_WARNING in summary and all(f"[{name}.md]" in summary for name in STEPS)

    before = _mtimes(out)
    with one_torch_thread():
        assert main(["bench", "suite", "--device", "cpu", "--scale", "tiny", "--out", str(out), "--resume"]) == 0
    printed = capsys.readouterr().out
    assert all(f"{name}: skipped" in printed for name in STEPS)
    assert {k: v for k, v in _mtimes(out).items() if k != "README.md"} == {k: v for k, v in before.items()
                                                                            if k != "README.md"}

    for name in ("core-bench.json", "core-bench.md"):
        (out / name).unlink()
    assert not step_done(out, STEPS["core"])
    before = _mtimes(out)
    with one_torch_thread():
        assert main(["bench", "suite", "--device", "cpu", "--scale", "tiny", "--out", str(out), "--resume",
                     "--only", "core,vlm"]) == 0
    printed = capsys.readouterr().out
    assert "core: done" in printed and "vlm: skipped" in printed
    after = _mtimes(out)
    changed = {k for k in after if before.get(k) != after[k]}
    assert changed == {"core-bench.json", "core-bench.md", "core.json", "core.md", "README.md"}
