"""Run the suite's steps: each builds its zoo entries, runs its bench into a staging folder, then moves the
bench's reports into the output folder and writes its own step report last (the mark `--resume` trusts)."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from specmm.bench.suite.figures import step_report
from specmm.bench.suite.steps import TINY, Step
from specmm.bench.suite.summary import write_summary
from specmm.jobs import OutputLock, atomic_write_json, atomic_write_text
from specmm.jobs.atomic import fsync_folder

logger = logging.getLogger(__name__)

STAGING = ".staging"
STEP_BUDGET_S = 540.0  # each step must fit one <10-minute device command: 9 minutes, training included


@dataclass(frozen=True)
class SuiteConfig:
    out: Path
    device: str
    scale: str
    resume: bool = False
    eager: bool = False  # refuse compiled mode even where the bench has it
    progress: bool = True

    @property
    def dtype(self) -> str:
        """bfloat16 on GPUs (the figures the anchors report); float32 elsewhere, where bf16 matmuls are emulated."""
        return "bfloat16" if torch.device(self.device).type == "cuda" else "float32"

    @property
    def compiled(self) -> bool:
        """Compiled mode on GPUs unless refused; CPU runs stay eager (inductor's CPU codegen would dominate)."""
        return torch.device(self.device).type == "cuda" and not self.eager


def step_done(out: Path, step: Step) -> bool:
    """A step's reports are all there: its step report and every file it lists."""
    try:
        record = json.loads((out / f"{step.name}.json").read_text())
        files = record["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return all((out / name).is_file() for name in files)


@dataclass(frozen=True)
class BenchRunner:
    """How the suite reaches the benches (the command layer provides it: the library never imports the CLI)."""
    options: Callable[[tuple[str, ...]], set[str]]  # a bench command's option strings (capability detection)
    run: Callable[[list[str]], None]  # run one `specmm ...` command in this process; raises on failure


def bench_argv(step: Step, config: SuiteConfig, options: set[str], out: Path) -> tuple[list[str], dict]:
    """The bench command of `step` (whose parser has `options`) and what it says about the run's mode (dtype,
    compiled or eager, and why)."""
    argv = [*step.command, "--scale", config.scale, "--device", config.device, "--out", str(out),
            "--name", f"{step.name}-bench", *step.args(config.scale)]
    mode = {"dtype": "float32 (the bench has no --dtype)"}
    if "--dtype" in options:
        argv += ["--dtype", config.dtype]
        mode["dtype"] = config.dtype
    flag = next((f for f in step.compile_flags if f in options), None)
    if flag is None:
        mode["mode"] = "eager (the bench has no compiled mode yet)"
    elif config.compiled:
        argv.append(flag)
        mode["mode"] = f"compiled where the bench compiles ({flag}), eager rows beside"
    else:
        mode["mode"] = ("eager (--eager)" if config.eager else f"eager (compiled mode, {flag}, is run on GPUs only)")
    return argv, mode


class Relocated(io.TextIOBase):
    """A text stream that writes to `stream` with every `old` path replaced by `new`."""

    def __init__(self, stream, old: str, new: str):
        self.stream, self.old, self.new = stream, old, new

    def write(self, text: str) -> int:
        self.stream.write(text.replace(self.old, self.new))
        return len(text)

    def flush(self) -> None:
        self.stream.flush()


def _move_into(staging: Path, out: Path) -> list[str]:
    """Move every file the bench wrote into `out` (renames within one file system: atomic); returns their names."""
    moved = []
    for path in sorted(p for p in staging.iterdir() if p.is_file() and not p.name.startswith(".")):
        os.replace(path, out / path.name)
        moved.append(path.name)
    fsync_folder(out)
    return moved


def run_step(step: Step, config: SuiteConfig, runner: BenchRunner) -> dict:
    """Build, bench, write: returns the step's record (also written as `<out>/<step>.json`)."""
    from specmm import zoo

    staging = config.out / STAGING / step.name
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    argv, mode = bench_argv(step, config, runner.options(step.command), staging)
    started = time.perf_counter()
    builds = {}
    for name in step.zoo:
        t0 = time.perf_counter()
        zoo.build(name, config.scale, progress=config.progress)
        builds[name] = round(time.perf_counter() - t0, 1)
    build_s = time.perf_counter() - started
    with contextlib.redirect_stdout(Relocated(sys.stdout, str(staging), str(config.out))):
        runner.run(argv)  # the bench's own lines name the files where they will be, not the staging folder
    bench_s = time.perf_counter() - started - build_s
    files = _move_into(staging, config.out)
    shutil.rmtree(staging, ignore_errors=True)
    shown = [str(config.out) if a == str(staging) else a for a in argv]  # as if the bench wrote there itself
    record = step_report(step, config, files, argv=shown, mode=mode, builds=builds,
                         timing={"build_s": round(build_s, 1), "bench_s": round(bench_s, 1),
                                 "budget_s": STEP_BUDGET_S})
    atomic_write_text(config.out / f"{step.name}.md", record.pop("markdown"))
    record["files"] = [*files, f"{step.name}.md"]
    atomic_write_json(config.out / f"{step.name}.json", record)  # last: the step's 'done' mark
    return record


def run_suite(steps: list[Step], config: SuiteConfig, runner: BenchRunner) -> dict[str, str]:
    """Run `steps` in order (skipping finished ones with `resume`); a failed step is logged and the next one runs.
    Rewrites `<out>/README.md` after every step. Returns each step's outcome: done, skipped or failed: <why>."""
    config.out.mkdir(parents=True, exist_ok=True)
    outcomes: dict[str, str] = {}
    with OutputLock(config.out / ".suite.lock", "--out", config.out):
        for step in steps:
            if config.resume and step_done(config.out, step):
                outcomes[step.name] = "skipped (reports already there)"
                print(f"[suite] {step.name}: reports already in {config.out}, skipped (--resume)")
                continue
            print(f"[suite] {step.name}: building {', '.join(step.zoo)} ({config.scale}) and running "
                  f"specmm {' '.join(step.command)}")
            try:
                record = run_step(step, config, runner)
            except Exception as err:  # noqa: BLE001 - one failed step must not cost the others their figures
                logger.exception("step %s failed", step.name)
                outcomes[step.name] = f"failed: {type(err).__name__}: {err}"
                print(f"[suite] {step.name}: FAILED ({type(err).__name__}: {err})", file=sys.stderr)
                continue
            outcomes[step.name] = "done"
            print(f"[suite] {step.name}: done in {record['timing']['total_s']:.1f} s; wrote "
                  f"{', '.join(record['files'])}")
            write_summary(config.out, tiny=config.scale == TINY)
        write_summary(config.out, tiny=config.scale == TINY)
        shutil.rmtree(config.out / STAGING, ignore_errors=True)
    return outcomes


__all__ = ["STEP_BUDGET_S", "BenchRunner", "SuiteConfig", "bench_argv", "run_step", "run_suite", "step_done"]
