"""`specmm reason`: one JSON line per prompt, keyed by the prompt's text; resume continues only the same job;
prompts too long for the context become error lines while their batch-mates run; bad input is refused clearly."""

from __future__ import annotations

import json

import pytest

from specmm.cli import main
from specmm.jobs import Job

BASE = ["reason", "--scale", "tiny", "--policy", "random", "--threshold", "0.5", "--max-new-tokens", "12",
        "--max-step-tokens", "4", "--batch-size", "2"]


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_reason_writes_rollouts_and_resumes(tiny_zoo, tmp_path, capsys):
    tiny_zoo("chainarith")
    out = tmp_path / "rollouts.jsonl"
    args = [*BASE, "--out", str(out)]
    assert main([*args, "--problems", "3"]) == 0
    first = lines(out)
    assert [r["index"] for r in first] == [0, 1, 2] and len({r["key"] for r in first}) == 3
    for r in first:
        assert len(r["completion_ids"]) == len(r["source"]) == len(r["behaviour_logprobs"]) <= 12
        assert r["step_spans"][-1][1] == len(r["completion_ids"]) and not r["exact"]
    assert main([*args, "--problems", "5"]) == 2  # the file exists and --resume was not given
    assert "--out" in capsys.readouterr().err
    assert main([*args, "--problems", "5", "--resume"]) == 0
    again = lines(out)
    assert again[:3] == first and [r["index"] for r in again[3:]] == [3, 4]


def test_resume_with_another_prompts_file_matches_prompts_by_text_not_line(tiny_zoo, tmp_path):
    tiny_zoo("chainarith")
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("1+2=\n3*4=\n")
    b.write_text("9-5=\n1+2=\n")  # another file: a new prompt on line 0, an old one moved to line 1
    out = tmp_path / "out.jsonl"
    args = [*BASE, "--out", str(out)]
    assert main([*args, "--prompts", str(a)]) == 0
    before = {r["prompt"]: r for r in lines(out)}
    assert main([*args, "--prompts", str(b), "--resume"]) == 0
    after = lines(out)
    assert [r["prompt"] for r in after] == ["9-5=", "1+2=", "3*4="]  # b's order, then a's leftover, each once
    assert after[1]["completion"] == before["1+2="]["completion"] and after[2] == before["3*4="]
    fresh = tmp_path / "fresh.jsonl"
    assert main([*BASE, "--out", str(fresh), "--prompts", str(b)]) == 0
    assert lines(fresh)[0]["completion_ids"] == after[0]["completion_ids"]  # the new prompt's own answer


def test_resume_with_other_sampling_is_refused_naming_the_setting(tiny_zoo, tmp_path, capsys):
    tiny_zoo("chainarith")
    out = tmp_path / "out.jsonl"
    assert main([*BASE, "--out", str(out), "--problems", "2"]) == 0
    before = out.read_bytes()
    assert main([*BASE, "--out", str(out), "--problems", "2", "--resume", "--temperature", "0.7"]) == 2
    assert "temperature: 0.0 -> 0.7" in capsys.readouterr().err and out.read_bytes() == before
    assert main([*BASE, "--out", str(out), "--problems", "2", "--force", "--temperature", "0.7"]) == 0
    assert out.read_bytes() != before


def test_a_second_concurrent_run_is_refused(tiny_zoo, tmp_path, capsys):
    tiny_zoo("chainarith")
    out = tmp_path / "out.jsonl"
    with Job(out, "reason", {}):  # another process holding the output (the lock is per open file)
        assert main([*BASE, "--out", str(out), "--problems", "2", "--resume"]) == 2
    assert "is being written by another specmm job (PID" in capsys.readouterr().err
    assert not out.exists() or out.read_text() == ""


def test_an_overlong_prompt_becomes_an_error_line_and_its_batch_mates_are_unaffected(tiny_zoo, tmp_path):
    tiny_zoo("chainarith")
    normal, mixed = tmp_path / "normal.txt", tmp_path / "mixed.txt"
    normal.write_text("1+2=\n3*4=\n5-1=\n")
    mixed.write_text("1+2=\n" + "7" * 100_000 + "\n3*4=\n5-1=\n")  # the long one shares a batch with 1+2=
    out, reference = tmp_path / "out.jsonl", tmp_path / "ref.jsonl"
    assert main([*BASE, "--out", str(reference), "--prompts", str(normal)]) == 0
    assert main([*BASE, "--out", str(out), "--prompts", str(mixed)]) == 0
    got = lines(out)
    assert [("error" in r) for r in got] == [False, True, False, False]
    assert "exceeds the model's context of 256" in got[1]["error"] and got[1]["index"] == 1
    strip = lambda r: {k: v for k, v in r.items() if k != "index"}  # noqa: E731
    assert [strip(r) for r in got if "error" not in r] == [strip(r) for r in lines(reference)]


@pytest.mark.parametrize("value", ["-1", "0", "x"])
def test_bad_batch_sizes_are_refused_before_any_work(tmp_path, capsys, value):
    with pytest.raises(SystemExit) as exit_info:
        main([*BASE, "--batch-size", value, "--out", str(tmp_path / "o.jsonl")])
    assert exit_info.value.code == 2
    assert "argument --batch-size: expected an integer >= 1" in capsys.readouterr().err
    assert not (tmp_path / "o.jsonl").exists()


def test_a_budget_past_the_context_is_refused(tiny_zoo, tmp_path, capsys):
    tiny_zoo("chainarith")
    assert main([*BASE, "--max-new-tokens", "400", "--out", str(tmp_path / "o.jsonl")]) == 2
    assert "--max-new-tokens: 400 new tokens" in capsys.readouterr().err


def test_input_errors_name_the_file_or_argument(tiny_zoo, tmp_path, capsys):
    folder = tiny_zoo("chainarith")
    prompts = tmp_path / "latin1.txt"
    prompts.write_bytes("caf\xe9=\n".encode("latin-1"))
    target, draft = str(folder / "target"), str(folder / "draft")
    common = ["reason", "--max-new-tokens", "8", "--out", str(tmp_path / "o.jsonl")]
    assert main([*common, "--target", target, "--draft", draft, "--prompts", str(prompts)]) == 2
    assert f"--prompts: {prompts} is not UTF-8 text (byte 3" in capsys.readouterr().err
    prompts.write_text("1+2=\n")
    assert main([*common, "--target", str(tmp_path / "nope"), "--draft", draft, "--prompts", str(prompts)]) == 2
    assert f"--target: {tmp_path / 'nope'} does not exist" in capsys.readouterr().err
    assert main([*common, "--target", target, "--draft", draft, "--prompts", str(prompts)]) == 2  # specreason
    assert "--judge: --policy specreason" in capsys.readouterr().err
    assert main([*common, "--target", target, "--draft", draft, "--prompts", str(prompts), "--judge", "<JUDGE>"]) == 0


def test_nan_weights_exit_2_naming_the_model(tiny_zoo, tmp_path, capsys):
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    folder = tiny_zoo("chainarith")
    broken = tmp_path / "target"
    shutil.copytree(folder / "target", broken)
    state = load_file(broken / "model.safetensors")
    state = {k: torch.full_like(v, float("nan")) if "lm_head" in k or "embed" in k else v for k, v in state.items()}
    save_file(state, broken / "model.safetensors")
    prompts = tmp_path / "p.txt"
    prompts.write_text("1+2=\n")
    out = tmp_path / "o.jsonl"
    assert main(["reason", "--target", str(broken), "--draft", str(folder / "draft"), "--prompts", str(prompts),
                 "--policy", "target-only", "--max-new-tokens", "8", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "specmm: error: LlamaForCausalLM" in err and "non-finite logits" in err and "token 0" in err
    assert not out.exists() or out.read_text() == ""


def test_async_schedule_with_refill_writes_the_rollouts_of_lockstep(tiny_zoo, tmp_path, capsys):
    tiny_zoo("chainarith")
    lockstep, rows = tmp_path / "lockstep.jsonl", tmp_path / "async.jsonl"
    assert main([*BASE, "--out", str(lockstep), "--problems", "5"]) == 0
    assert main([*BASE, "--out", str(rows), "--problems", "5", "--schedule", "async", "--refill"]) == 0
    exact = lambda r: {k: v for k, v in r.items() if k not in ("behaviour_logprobs", "scores")}  # noqa: E731
    assert [exact(r) for r in lines(rows)] == [exact(r) for r in lines(lockstep)]
    for a, b in zip(lines(rows), lines(lockstep)):  # float32 models batched differently: equal to rounding
        assert a["behaviour_logprobs"] == pytest.approx(b["behaviour_logprobs"], abs=1e-5)
    assert main([*BASE, "--out", str(tmp_path / "o.jsonl"), "--problems", "2", "--refill"]) == 2
    assert "--refill: waiting prompts join a running batch only with --schedule async" in capsys.readouterr().err


@pytest.mark.parametrize("extra, message", [
    (["--prompts", "{empty}"], "--prompts: {empty} holds no prompt"),
    (["--policy", "specreason", "--threshold", "9.5"], "--threshold: --policy specreason takes a number in [0, 9]"),
    (["--policy", "arbitrage", "--threshold", "1.5"], "--threshold: --policy arbitrage takes a number in [0, 1]"),
    (["--policy", "target-only", "--threshold", "0.5"], "--threshold: --policy target-only has no threshold"),
    (["--out", "{file}/o.jsonl"], "cannot be written: {file} is a file"),
])
def test_bad_prompts_thresholds_and_outputs_are_refused_before_any_model_loads(tmp_path, capsys, monkeypatch,
                                                                               extra, message):
    import specmm.cli.reason as reason

    monkeypatch.setattr(reason, "_load_models", lambda *a: pytest.fail("models loaded before the refusal"))
    names = {"empty": tmp_path / "empty.txt", "file": tmp_path / "file"}
    names["empty"].write_text("\n  \n")
    names["file"].write_text("x")
    fill = lambda text: text.format(**names)  # noqa: E731
    argv = [*BASE, "--out", str(tmp_path / "o.jsonl"), *[fill(a) for a in extra]]
    assert main(argv) == 2
    assert fill(message) in capsys.readouterr().err


def test_resume_with_another_threshold_is_refused_even_when_names_round_alike(tiny_zoo, tmp_path, capsys):
    tiny_zoo("chainarith")
    out = tmp_path / "out.jsonl"
    args = [a if a != "0.5" else "0.501" for a in BASE]  # RandomRouting's name shows p to two decimals
    assert main([*args, "--out", str(out), "--problems", "2"]) == 0
    assert main([*BASE, "--out", str(out), "--problems", "2", "--resume"]) == 2
    assert "threshold: 0.501 -> 0.5" in capsys.readouterr().err
