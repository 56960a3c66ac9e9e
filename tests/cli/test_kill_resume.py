"""Fault injection per job kind: SIGKILL a job at a seeded random write (sometimes half-way through it), resume it,
and the output equals an uninterrupted run's: nothing lost, nothing twice, nothing torn."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from specmm.zoo import store
from tests.cli.faults import cli, count_writes, kill_point, run_killed
from tests.cli.test_caption import folders  # noqa: F401  (module fixture: a saved tiny LLaVA and 5 scenes)

LLAMAGEN = Path("/work/shared/fixtures/llamagen")


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def check(kind: str, seed: int, args, out_of, resume: list[str], compare) -> None:
    """Uninterrupted run -> A; a run killed at a seeded write -> B; resume B; compare(A, B)."""
    a, b = out_of("full"), out_of("killed")
    writes = count_writes(kind, cli(args(a)))
    at, torn = kill_point(seed, writes)
    print(f"{kind}: killed {'half-way through' if torn else 'after'} write {at} of {writes}")
    run_killed(kind, at, torn, cli(args(b)))
    with pytest.raises((AssertionError, TypeError, OSError)):  # the kill left the job unfinished
        compare(a, b)
    cli(args(b) + resume)()
    compare(a, b)


@pytest.mark.parametrize("seed", [0, 2])  # kill after write 2 of 3; half-way through write 1
def test_caption(folders, tmp_path, seed):  # noqa: F811
    target, imgs = folders

    def args(out):
        return ["caption", "--target", str(target), "--drafter", "prompt-lookup", "--images", str(imgs), "--out",
                str(out), "--batch-size", "2", "--max-new-tokens", "6", "--device", "cpu"]

    def compare(a, b):
        assert b.read_bytes() == a.read_bytes() and len(lines(b)) == 5

    check("journal", seed, args, lambda name: tmp_path / f"{name}.jsonl", ["--resume"], compare)


@pytest.mark.parametrize("seed", [0, 4])  # kill after write 2 of 3; half-way through write 1
def test_reason(tiny_zoo, tmp_path, seed):
    tiny_zoo("chainarith")

    def args(out):
        return ["reason", "--scale", "tiny", "--policy", "random", "--threshold", "0.5", "--max-new-tokens", "12",
                "--max-step-tokens", "4", "--batch-size", "2", "--problems", "5", "--out", str(out)]

    def compare(a, b):
        assert b.read_bytes() == a.read_bytes() and [r["index"] for r in lines(b)] == [0, 1, 2, 3, 4]

    check("journal", seed, args, lambda name: tmp_path / f"{name}.jsonl", ["--resume"], compare)


def pngs(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("class*.png"))}


def same_images(a: Path, b: Path) -> None:
    assert pngs(b) == pngs(a) and (b / "grid.png").read_bytes() == (a / "grid.png").read_bytes()
    assert not list(b.glob(".*.tmp"))  # temporaries of the killed write were cleared


def test_sample_images(tmp_path):
    def args(out):
        return ["sample-images", "--gpt-ckpt", str(LLAMAGEN / "gpt_c2i.pt"), "--vq-ckpt", str(LLAMAGEN / "vq.pt"),
                "--gpt-config", str(LLAMAGEN / "gpt_c2i_config.json"), "--vq-config",
                str(LLAMAGEN / "vq_config.json"), "--top-k", "16", "--cfg-scale", "2.0", "--classes", "1,2",
                "--per-class", "2", "--batch-size", "1", "--method", "sjd", "--out", str(out)]

    check("png", 5, args, lambda name: tmp_path / name, ["--resume"], same_images)  # half-way through PNG 3 of 4


def test_sample_continuous(tiny_zoo, tmp_path):
    folder = tiny_zoo("cspd")

    def args(out):
        return ["sample-continuous", "--target", str(folder / "target"), "--draft", str(folder / "draft"), "--vae",
                str(folder / "vae"), "--classes", "0,2", "--per-class", "3", "--batch-size", "2", "--k", "2",
                "--out", str(out)]

    check("png", 0, args, lambda name: tmp_path / name, ["--resume"], same_images)  # after PNG 4 of 6


def test_zoo_build(tmp_path, monkeypatch):
    homes = {}

    def args(home):
        monkeypatch.setenv("SPECMM_HOME", str(home))
        homes[home.name] = home
        return ["zoo", "build", "code", "--scale", "tiny"]

    def compare(a, b):
        files = lambda home: {rel: meta["sha256"] for rel, meta in  # noqa: E731
                              store.read_manifest(home / "zoo" / "code-tiny")["files"].items()}
        assert files(b) == files(a) and any(rel.endswith("model.safetensors") for rel in files(a))
        assert store.read_manifest(b / "zoo" / "code-tiny")["resumed_from_checkpoint"] is True
        assert not store.problems(b / "zoo" / "code-tiny")

    check("torch", 7, args, lambda name: tmp_path / name, [], compare)


def test_train_drafter(tiny_zoo, tmp_path):
    tiny_zoo("captioner")

    def args(out):
        return ["train-drafter", "--scale", "tiny", "--method", "eagle", "--scenes", "4", "--text-steps", "3",
                "--multimodal-steps", "3", "--batch-size", "2", "--checkpoint-every", "1", "--device", "cpu",
                "--out", str(out)]

    def compare(a, b):
        from safetensors.torch import load_file

        # tensors, not bytes: safetensors writes its header's metadata keys in a per-process order
        ours, reference = load_file(b / "model.safetensors"), load_file(a / "model.safetensors")
        assert ours.keys() == reference.keys() and all(torch.equal(ours[k], reference[k]) for k in ours)
        assert (b / "config.json").read_text() == (a / "config.json").read_text()

    check("torch", 2, args, lambda name: tmp_path / name, [], compare)
