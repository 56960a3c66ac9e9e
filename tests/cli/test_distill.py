"""`specmm distill-draft` on the tiny zoo `code` pair: it writes a loadable draft closer to the target, resumes
as one job, and refuses bad input before any work."""

from __future__ import annotations

import json

import torch
from transformers import AutoModelForCausalLM

from specmm.cli import main


def _corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(f"def f{i}(x):\n    return x + {i}\n" for i in range(60)), encoding="utf-8")
    return path


def _args(code, corpus, out, *extra):
    return ["distill-draft", "--target", str(code / "target"), "--draft", str(code / "draft"), "--text", str(corpus),
            "--out", str(out), "--steps", "4", "--batch-size", "2", "--seq-len", "16", "--checkpoint-every", "2",
            "--lr", "1e-2", "--device", "cpu", *extra]


def test_distill_draft_writes_a_draft_closer_to_the_target_and_resumes(tiny_zoo, tmp_path, capsys):
    code = tiny_zoo("code")
    corpus, out = _corpus(tmp_path), tmp_path / "out"
    assert main(_args(code, corpus, out)) == 0
    printed = capsys.readouterr().out
    assert "held-out top-1 agreement" in printed and "saved the distilled draft" in printed
    record = json.loads((out / "distill.json").read_text())
    assert record["heldout_after"]["kl"] < record["heldout_before"]["kl"]
    distilled = AutoModelForCausalLM.from_pretrained(out)
    original = AutoModelForCausalLM.from_pretrained(code / "draft")
    assert any(not torch.equal(a, b) for a, b in zip(distilled.state_dict().values(), original.state_dict().values()))
    weights = (out / "model.safetensors").read_bytes()

    assert main(_args(code, corpus, out)) == 0  # the same job again: resumes at its end, same weights
    assert (out / "model.safetensors").read_bytes() == weights
    assert main(_args(code, corpus, out, "--seed", "1")) == 2  # another job in the same folder
    assert "different job" in capsys.readouterr().err


def test_distill_draft_refuses_bad_input_before_work(tiny_zoo, tmp_path, capsys):
    code = tiny_zoo("code")
    corpus = _corpus(tmp_path)
    assert main(_args(code, tmp_path / "missing.txt", tmp_path / "a")) == 2
    assert "--text" in capsys.readouterr().err and not (tmp_path / "a").exists()
    not_a_model = _args(code, corpus, tmp_path / "b")
    not_a_model[2] = str(tmp_path)  # --target: a folder without config.json
    assert main(not_a_model) == 2
    assert "--target" in capsys.readouterr().err
    short = tmp_path / "short.txt"
    short.write_text("x = 1", encoding="utf-8")
    assert main(_args(code, short, tmp_path / "c")) == 2
    assert "too few for windows of --seq-len" in capsys.readouterr().err and not (tmp_path / "c").exists()
