"""`specmm demo` at micro scale: the headline trains what it needs, runs specmm compiled against both plain-decoding
baselines, and prints compile time apart; an unbuilt section is skipped, not built."""

from __future__ import annotations

from specmm import zoo
from specmm.bench.report import TINY_WARNING
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
    assert "Captioning" in page and "Skipped" in page and "specmm zoo build code --scale tiny" in printed
    assert "specmm demo --scale tiny --all" in printed  # the hints keep the scale they ran at
    assert printed.startswith(TINY_WARNING) and TINY_WARNING in page  # the one banner of tiny-scale output
    assert "speedup vs best AR" in page
    built = sorted(p.name for p in (tmp_path / "home" / "zoo").iterdir() if not p.name.startswith("."))  # not locks
    assert built == ["captioner-tiny", "captioner-vispec-tiny"]
    assert zoo.path("captioner-vispec", "tiny").is_dir()


def test_a_failing_section_becomes_an_error_block_and_the_other_sections_still_run(tmp_path, monkeypatch, capsys):
    import pytest

    from specmm import demo
    from specmm.bench.harness import BenchReport

    page = tmp_path / "demo.html"

    def ok(title):
        def run(scale, device):
            return (BenchReport(name=title, command="specmm demo", rows=[], setup={"scale": scale}),
                    f"<p>{title} ran</p>")
        return run

    def crashes(scale, device):
        raise RuntimeError("shape mismatch in the middle of a section")

    def reads_the_report_so_far(scale, device):  # the report is written after every section, not only at the end
        assert "first ran" in page.read_text() and "This section failed" in page.read_text()
        return ok("last")(scale, device)

    monkeypatch.setattr(demo, "HEADLINE", demo.DemoSection("First", (), ok("first"), 0))
    monkeypatch.setattr(demo, "SECTIONS", [demo.DemoSection("Broken", (), crashes, 0),
                                           demo.DemoSection("Last", (), reads_the_report_so_far, 0)])
    with pytest.raises(demo.DemoFailed, match="1 section.* failed .*Broken: RuntimeError: shape mismatch") as err:
        run_demo(scale="tiny", out=page)
    assert [r.name for r in err.value.reports] == ["first", "last"]
    html = page.read_text()
    assert html.index("first ran") < html.index("This section failed") < html.index("last ran")
    assert "RuntimeError: shape mismatch" in html and "traceback" in html and "Still running" not in html


def test_the_cli_demo_reports_a_failed_section_as_an_error_after_writing_the_report(tmp_path, monkeypatch, capsys):
    from specmm import demo
    from specmm.cli import main

    def crashes(scale, device):
        raise ValueError("boom")

    monkeypatch.setattr(demo, "HEADLINE", demo.DemoSection("Headline", (), crashes, 0))
    monkeypatch.setattr(demo, "SECTIONS", [])
    assert main(["demo", "--scale", "tiny", "--device", "cpu", "--out", str(tmp_path / "d.html")]) == 2
    assert "specmm: error: demo: 1 section(s) failed (Headline: ValueError: boom)" in capsys.readouterr().err
    assert "This section failed" in (tmp_path / "d.html").read_text()


def test_the_diffusion_section_reads_its_length_from_the_zoo_entry(tiny_zoo):
    from specmm.demo import run_dlm

    tiny_zoo("dlm-code")  # stores 16-token continuations at --scale tiny
    report, body = run_dlm("tiny", "cpu")
    assert report.setup["gen_length"] == 16 and "stepwise" in body
