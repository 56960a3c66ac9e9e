"""`specmm bench suite`: every modality's benchmark, step by step, into one folder (see specmm.bench.suite)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specmm.cli.common import default_device, device_arg, scale_argument


def cmd_bench_suite(args) -> int:
    from specmm import zoo
    from specmm.bench.suite import BenchRunner, SuiteConfig, run_suite, select_steps

    steps = select_steps(args.only)  # every refusal below comes before any build or bench
    missing = sorted({f"{name} (scales: {', '.join(zoo.get(name).recipes)})" for step in steps for name in step.zoo
                      if args.scale not in zoo.get(name).recipes})
    if missing:
        raise ValueError(f"--scale: {args.scale!r} is not a scale of {'; '.join(missing)}")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out: {out} is a file, expected a folder for the suite's reports")
    config = SuiteConfig(out=out, device=args.device, scale=args.scale, resume=args.resume, eager=args.eager,
                         progress=not args.quiet)
    outcomes = run_suite(steps, config, BenchRunner(options=bench_options, run=run_command))
    for name, outcome in outcomes.items():
        print(f"{name}: {outcome}")
    print(f"summary: {out / 'README.md'}")
    return 1 if any(o.startswith("failed") for o in outcomes.values()) else 0


def bench_options(command: tuple[str, ...]) -> set[str]:
    """The option strings of a `specmm` subcommand, e.g. ("bench", "core"): how the suite learns whether a bench
    has --compile or --dtype yet."""
    from specmm.cli import build_parser

    parser = build_parser()
    for word in command:
        parser = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[word]
    return {s for action in parser._actions for s in action.option_strings}


def run_command(argv: list[str]) -> None:
    """Run `specmm <argv>` in this process (its reports record it as the command typed); raise if it fails."""
    from specmm.cli import build_parser

    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit_:  # argparse refused the command the suite built: a failed step, not a dead suite
        raise RuntimeError(f"`specmm {' '.join(argv)}`: arguments refused (exit {exit_.code})") from None
    saved, sys.argv = sys.argv, ["specmm", *argv]
    try:
        code = args.func(args)
    finally:
        sys.argv = saved
    if code:
        raise RuntimeError(f"`specmm {' '.join(argv)}` exited with {code}")


def add_parser(bench_sub) -> None:
    """Register `suite` under `bench`."""
    from specmm.bench.suite import STEPS

    p = bench_sub.add_parser("suite", help="every modality's benchmark, step by step (each step builds its zoo "
                             "entries, runs its bench and writes its reports at once)")
    p.add_argument("--device", type=device_arg, default=default_device())
    scale_argument(p, default="gpu", help="zoo scale of every step")
    p.add_argument("--out", required=True, help="folder of the reports (on a lent GPU machine: under $OUT)")
    p.add_argument("--only", help=f"comma-separated steps to run (default: all of {','.join(STEPS)})")
    p.add_argument("--resume", action="store_true", help="skip the steps whose reports are already in --out")
    p.add_argument("--eager", action="store_true", help="never compiled mode (default: compiled on GPUs where the "
                   "bench has it)")
    p.add_argument("--quiet", action="store_true", help="no training progress bars")
    p.set_defaults(func=cmd_bench_suite)


__all__ = ["add_parser", "bench_options", "cmd_bench_suite", "run_command"]
