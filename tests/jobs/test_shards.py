"""Jobs under `accelerate launch --num_processes 2` on CPU (gloo): `caption`, `sample-images`, `reason` and
`sample-continuous` write byte for byte what a single-process run writes, and a SIGKILL of one rank followed by
`--resume` with one process loses and repeats nothing.
(Each launch starts two interpreters: the four jobs share one launch.)"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from specmm.cli import main
from specmm.jobs.shards import leftover_parts
from tests.cli.test_caption import folders  # noqa: F401  (module fixture: a saved tiny LLaVA and 5 scenes)
from tests.cli.test_kill_resume import LLAMAGEN, same_images

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
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    print("$", " ".join(command[1:]), f"\n{run.stdout}(exit {run.returncode})")  # shown with pytest -s
    return run


def caption_args(target, imgs, out) -> list[str]:
    return ["caption", "--target", str(target), "--drafter", "prompt-lookup", "--images", str(imgs), "--out",
            str(out), "--batch-size", "1", "--max-new-tokens", "6", "--device", "cpu"]


def images_args(out) -> list[str]:
    return ["sample-images", "--gpt-ckpt", str(LLAMAGEN / "gpt_c2i.pt"), "--vq-ckpt", str(LLAMAGEN / "vq.pt"),
            "--gpt-config", str(LLAMAGEN / "gpt_c2i_config.json"), "--vq-config", str(LLAMAGEN / "vq_config.json"),
            "--top-k", "16", "--cfg-scale", "2.0", "--classes", "1,2", "--per-class", "2", "--batch-size", "1",
            "--method", "sjd", "--device", "cpu", "--out", str(out)]


def reason_args(out) -> list[str]:
    return ["reason", "--scale", "tiny", "--policy", "random", "--threshold", "0.5", "--max-new-tokens", "12",
            "--max-step-tokens", "4", "--batch-size", "1", "--problems", "4", "--device", "cpu", "--out", str(out)]


def continuous_args(folder, out) -> list[str]:
    return ["sample-continuous", "--target", str(folder / "target"), "--vae", str(folder / "vae"), "--draft",
            str(folder / "draft"), "--k", "2", "--classes", "0,2", "--per-class", "2", "--batch-size", "1",
            "--device", "cpu", "--out", str(out)]


@pytest.mark.skipif(not LLAMAGEN.is_dir(), reason="LlamaGen fixtures not available")
def test_two_processes_write_what_one_process_writes(folders, tiny_zoo, tmp_path):  # noqa: F811
    tiny_zoo("chainarith")
    cspd = tiny_zoo("cspd")
    target, imgs = folders
    one, two = tmp_path / "one", tmp_path / "two"
    commands = {"caption": lambda root: caption_args(target, imgs, root / "captions.jsonl"),
                "images": lambda root: images_args(root / "images"),
                "reason": lambda root: reason_args(root / "rollouts.jsonl"),
                "continuous": lambda root: continuous_args(cspd, root / "continuous")}
    for make in commands.values():
        assert main(make(one)) == 0
    argv = []
    for make in commands.values():
        argv += [*make(two), "--then"]
    run = launch(argv[:-1])
    assert run.returncode == 0, run.stderr[-3000:]
    reports = [line for line in run.stdout.splitlines() if " -> " in line]  # the main process reports each job
    assert len(reports) == 4 and "captioned 5," in reports[0] and reports[1].startswith("4 new images"), reports
    for name in ("captions.jsonl", "rollouts.jsonl"):
        assert (two / name).read_bytes() == (one / name).read_bytes(), name
        assert not leftover_parts(two / name)
    assert len((two / "rollouts.jsonl").read_text().splitlines()) == 4
    same_images(one / "images", two / "images")
    assert len(list((two / "images").glob("class*.png"))) == 4
    same_images(one / "continuous", two / "continuous")
    assert len(list((two / "continuous").glob("class*.png"))) == 4


def test_a_killed_rank_then_resume_with_one_process_loses_and_repeats_nothing(folders, tmp_path):  # noqa: F811
    target, imgs = folders
    single, killed = tmp_path / "single.jsonl", tmp_path / "killed.jsonl"
    assert main(caption_args(target, imgs, single)) == 0
    run = launch(caption_args(target, imgs, killed), kill_rank=1)
    assert run.returncode != 0
    print("\n".join(line for line in run.stderr.splitlines() if "rank" in line or "exitcode" in line))
    # torch elastic names the failed rank and its signal: "rank : 1 (local_rank: 1) / exitcode : -9"
    assert re.search(r"rank\s*:\s*1 \(local_rank: 1\)\s+exitcode\s*:\s*-9", run.stderr), run.stderr[-3000:]
    assert leftover_parts(killed)  # the killed run left its parts
    assert main(caption_args(target, imgs, killed) + ["--resume"]) == 0  # one process now
    assert killed.read_bytes() == single.read_bytes()
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
