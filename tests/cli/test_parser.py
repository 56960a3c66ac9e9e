"""The `specmm` command assembles every command group's subcommands and runs as `python -m specmm.cli`."""

from __future__ import annotations

import argparse
import runpy
import sys

import pytest

from specmm.cli import build_parser

COMMANDS = {"demo", "zoo", "bench", "train-drafter", "distill-draft", "caption", "sample-images", "train-image-drafter",
            "sample-continuous", "reason"}
BENCHES = {"core", "vlm", "ssm", "image_ar", "cspd", "dlm", "reasoning", "suite"}


def _choices(parser: argparse.ArgumentParser) -> dict:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def test_every_command_and_benchmark_is_registered_with_a_handler():
    commands = _choices(build_parser())
    assert set(commands) == COMMANDS
    assert set(_choices(commands["bench"])) == BENCHES
    for name, parser in commands.items():
        assert callable(parser.get_default("func")), name
    assert _choices(commands["bench"])["reasoning"].get_default("func").__name__ == "cmd_bench_reasoning"
    assert _choices(commands["bench"])["suite"].get_default("func").__name__ == "cmd_bench_suite"


def test_python_m_specmm_cli_prints_help(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["specmm", "--help"])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_module("specmm.cli", run_name="__main__")
    assert exit_info.value.code == 0
    assert "sample-continuous" in capsys.readouterr().out
