"""Step selection, resume marks and the suite's refusals of bad input (each before any build or bench)."""

from __future__ import annotations

import json
import re

import pytest

from specmm.bench.suite import STEPS, SuiteConfig, select_steps, step_done
from specmm.bench.suite.run import bench_argv
from specmm.cli import main


def test_only_selects_named_steps_in_suite_order():
    assert [s.name for s in select_steps("reasoning, core")] == ["core", "reasoning"]
    assert [s.name for s in select_steps(None)] == list(STEPS)


@pytest.mark.parametrize("only, message", [("core,nope", "unknown step(s) 'nope'"), ("core,", "expected comma"),
                                           ("", "expected comma")])
def test_only_refuses_unknown_or_empty_names(only, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        select_steps(only)


@pytest.mark.parametrize("argv, message", [
    (["--only", "core,imgae_ar"], "--only: unknown step"),
    (["--scale", "huge"], "--scale: invalid choice: 'huge'"),  # an argparse usage error (exit 2 as well)
])
def test_cli_refuses_bad_input_before_any_work(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.setenv("SPECMM_HOME", str(tmp_path / "home"))
    out = tmp_path / "out"
    try:
        code = main(["bench", "suite", "--device", "cpu", "--out", str(out), "--resume", *argv])
    except SystemExit as exit_info:
        code = exit_info.code
    assert code == 2
    assert message in capsys.readouterr().err
    assert not out.exists() and not (tmp_path / "home").exists()  # nothing built, nothing written


def test_cli_refuses_an_out_that_is_a_file(tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    assert main(["bench", "suite", "--device", "cpu", "--scale", "tiny", "--out", str(tmp_path / "f")]) == 2
    assert "--out:" in capsys.readouterr().err


def test_resume_reruns_steps_whose_reports_are_missing_or_unreadable(tmp_path):
    step = STEPS["core"]
    assert not step_done(tmp_path, step)
    (tmp_path / "core.json").write_text("{not json")
    assert not step_done(tmp_path, step)
    (tmp_path / "core.json").write_text(json.dumps({"files": ["core-bench.json", "core.md"]}))
    (tmp_path / "core.md").write_text("x")
    assert not step_done(tmp_path, step)  # a listed bench report is missing
    (tmp_path / "core-bench.json").write_text("{}")
    assert step_done(tmp_path, step)


def test_bench_command_detects_compiled_mode_and_dtype_from_the_bench_options(tmp_path):
    gpu = SuiteConfig(out=tmp_path, device="cuda", scale="gpu")
    argv, mode = bench_argv(STEPS["core"], gpu, {"--compile", "--dtype"}, tmp_path)
    assert argv[-3:] == ["--dtype", "bfloat16", "--compile"] and "compiled" in mode["mode"]
    argv, mode = bench_argv(STEPS["image_ar"], gpu, {"--resume"}, tmp_path)  # no --compile/--dtype (yet)
    assert "--compile" not in argv and "--dtype" not in argv
    assert mode == {"dtype": "float32 (the bench has no --dtype)", "mode": "eager (the bench has no compiled mode yet)"}
    argv, _ = bench_argv(STEPS["image_ar"], gpu, {"--compile"}, tmp_path)  # a branch that adds --compile is used
    assert argv[-1] == "--compile"
    argv, mode = bench_argv(STEPS["core"], SuiteConfig(out=tmp_path, device="cpu", scale="tiny"),
                            {"--compile", "--dtype"}, tmp_path)
    assert "--compile" not in argv and argv[-1] == "float32" and mode["mode"].startswith("eager")
