"""`specmm demo` at micro scale: the headline trains what it needs; an unbuilt section is skipped, not built."""

from __future__ import annotations

from specmm import zoo
from specmm.demo import run_demo


def test_demo_runs_the_headline_and_skips_unbuilt_sections(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECMM_HOME", str(tmp_path / "home"))
    reports = run_demo(scale="tiny", out=tmp_path / "demo.html")
    assert len(reports) == 1 and reports[0].rows[0].method.startswith("target")
    assert any("vispec" in row.method and row.matched for row in reports[0].rows)  # greedy: identical captions
    page = (tmp_path / "demo.html").read_text()
    assert "Captioning" in page and "Skipped" in page and "specmm zoo build code" in capsys.readouterr().out
    built = sorted(p.name for p in (tmp_path / "home" / "zoo").iterdir() if not p.name.startswith("."))  # not locks
    assert built == ["captioner-tiny", "captioner-vispec-tiny"]
    assert zoo.path("captioner-vispec", "tiny").is_dir()
