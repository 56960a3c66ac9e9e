"""Jobs under `accelerate launch --num_processes 2` on CPU (gloo): the merged output equals a single-process run's
byte for byte, and a SIGKILL of one rank followed by `--resume` with one process loses and repeats nothing."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from specmm.cli import main
from specmm.jobs.shards import leftover_parts
from tests.cli.test_caption import folders  # noqa: F401  (module fixture: a saved tiny LLaVA and 5 scenes)

LAUNCHED = Path(__file__).with_name("launched.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args: list[str], processes: int = 2, kill_rank: int | None = None) -> subprocess.CompletedProcess:
    """`accelerate launch --num_processes N launched.py ARGS` with one torch thread per process."""
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes),
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port",
               str(free_port()), str(LAUNCHED), *(["--kill-rank", str(kill_rank)] if kill_rank is not None else []),
               *args]
    root = Path(__file__).parents[2]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
           "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)


def caption_args(target, imgs, out) -> list[str]:
    return ["caption", "--target", str(target), "--drafter", "prompt-lookup", "--images", str(imgs), "--out",
            str(out), "--batch-size", "1", "--max-new-tokens", "6", "--device", "cpu"]


def test_two_process_caption_equals_one_process_and_survives_a_killed_rank(folders, tmp_path):  # noqa: F811
    target, imgs = folders
    single, double, killed = tmp_path / "single.jsonl", tmp_path / "double.jsonl", tmp_path / "killed.jsonl"
    assert main(caption_args(target, imgs, single)) == 0
    expected = single.read_bytes()
    assert len(expected.splitlines()) == 5

    run = launch(caption_args(target, imgs, double))
    assert run.returncode == 0, run.stderr[-3000:]
    assert double.read_bytes() == expected
    assert not leftover_parts(double)

    run = launch(caption_args(target, imgs, killed), kill_rank=1)
    assert run.returncode != 0
    assert "rank" in run.stderr and ": 1" in run.stderr, run.stderr[-3000:]  # torch elastic names the failed rank
    assert leftover_parts(killed)  # the killed run left its parts
    assert main(caption_args(target, imgs, killed) + ["--resume"]) == 0  # one process now
    assert killed.read_bytes() == expected
    assert not leftover_parts(killed)
    assert [json.loads(line)["image"] for line in killed.read_text().splitlines()] == sorted(
        str(p.resolve()) for p in imgs.iterdir())


def test_a_bare_cuda_device_is_the_local_rank_gpu_under_a_launcher(monkeypatch):
    import torch

    from specmm.jobs.shards import process_device

    monkeypatch.setenv("LOCAL_RANK", "3")
    assert process_device("cuda") == torch.device("cuda", 3)
    assert process_device("cuda:1") == torch.device("cuda", 1) and process_device("cpu") == torch.device("cpu")
    monkeypatch.delenv("LOCAL_RANK")
    assert process_device("cuda") == torch.device("cuda")
