"""`specmm demo` at micro scale: the headline trains what it needs, runs specmm compiled against both plain-decoding
baselines, and prints compile time apart; an unbuilt section is skipped, not built."""

from __future__ import annotations

from specmm import zoo
from specmm.demo import run_demo


def test_demo_runs_the_headline_and_skips_unbuilt_sections(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECMM_HOME", str(tmp_path / "home"))
    reports = run_demo(scale="tiny", out=tmp_path / "demo.html")
    assert len(reports) == 1 and reports[0].rows[0].method.startswith("target")
    rows = reports[0].rows
    vispec = next(row for row in rows if "vispec" in row.method)
    assert vispec.compiled and vispec.matched and vispec.timed_compiles == 0  # compiled mode: identical captions
    assert [row.compiled for row in rows if row.baseline] == [False, True]  # HF generate eager, static + compiled
    assert vispec.speedup_vs_best_ar == vispec.speedup / max(row.speedup for row in rows if row.baseline)
    printed = capsys.readouterr().out
    assert "compile time (untimed warm-up" in printed and "the best target-only row" in printed
    page = (tmp_path / "demo.html").read_text()
    assert "Captioning" in page and "Skipped" in page and "specmm zoo build code" in printed
    assert "speedup vs best AR" in page
    assert sorted(p.name for p in (tmp_path / "home" / "zoo").iterdir()) == ["captioner-tiny", "captioner-vispec-tiny"]
    assert zoo.path("captioner-vispec", "tiny").is_dir()
