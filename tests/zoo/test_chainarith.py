"""Zoo entry `chainarith`: the task's checker, and the tiny recipe (deterministic, resumable, loadable)."""

from __future__ import annotations

import random

import pytest
import torch

from specmm import zoo
from specmm.reasoning import StepSpeculator, TargetOnly
from specmm.zoo import chainarith, store
from specmm.zoo.chainarith_task import (
    STEP,
    StepChecker,
    answer_of,
    corrupt,
    expected_step,
    make_tokenizer,
    parse_prompt,
    sample_problem,
)
from tests.conftest import one_torch_thread


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECMM_HOME", str(tmp_path / "home"))
    with one_torch_thread():
        yield tmp_path / "home"


def test_checker_accepts_every_valid_step_and_rejects_every_corruption():
    tokenizer = make_tokenizer()
    checker = StepChecker(tokenizer)
    rng = random.Random(0)
    for _ in range(200):
        problem = sample_problem(rng)
        assert parse_prompt(problem.prompt) == problem
        steps = problem.steps()
        for k, step in enumerate(steps):
            context = tokenizer.encode(problem.prompt + "".join(steps[:k]))
            assert expected_step(tokenizer.decode(context)) == step
            assert checker([context], [tokenizer.encode(step)]) == [1.0]
            assert checker([context], [tokenizer.encode(corrupt(step, rng))]) == [0.0]
        assert answer_of("".join(steps)) == problem.answer


def test_products_are_harder_steps_than_additions_in_the_task_definition():
    rng = random.Random(1)
    ops = [op for _ in range(300) for op, _ in sample_problem(rng).ops]
    assert 0.4 < ops.count("*") / len(ops) < 0.6


def test_judge_digits_carry_the_judge_weight_and_the_loss_is_their_weighted_mean():
    from specmm.zoo.lm_training import LMTrainConfig, next_token_loss

    tokenizer = make_tokenizer()
    config = LMTrainConfig(seq_len=chainarith.SEQ_LEN, seed=3, steps=1, batch_size=16)
    batch = chainarith.batches(tokenizer, config, judge_share=0.5, hard_share=0.3, judge_weight=7.0)(0)
    judge = (batch["labels"] != -100).sum(1) == 1  # a judge example has one label: its digit
    assert judge.any() and (~judge).any()
    assert torch.all(batch["weights"][judge] == 7.0) and torch.all(batch["weights"][~judge] == 1.0)
    logits = torch.randn(*batch["input_ids"].shape, len(tokenizer), generator=torch.Generator().manual_seed(0))
    plain = next_token_loss(logits, batch["labels"])
    assert torch.allclose(next_token_loss(logits, batch["labels"], torch.ones_like(batch["weights"])), plain)
    per_token = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), batch["labels"][:, 1:].flatten(),
                                                  ignore_index=-100, reduction="none").view(len(judge), -1)
    valid = batch["labels"][:, 1:] != -100
    w = batch["weights"][:, 1:] * valid
    expected = (per_token * w).sum() / w.sum()
    assert torch.allclose(next_token_loss(logits, batch["labels"], batch["weights"]), expected)
    assert not torch.allclose(expected, plain)


def test_hard_share_sets_the_share_of_products_in_held_out_problems():
    for share in (0.3, 0.5):
        ops = [op for p in chainarith.heldout_problems(400, share) for op, _ in p.ops]
        assert abs(ops.count("*") / len(ops) - share) < 0.05
    assert chainarith.heldout_problems(5) == chainarith.heldout_problems(5, chainarith.hard_share_of({}))


def hashes(path) -> dict[str, str]:
    return {rel: meta["sha256"] for rel, meta in store.read_manifest(path)["files"].items()}


def test_tiny_build_is_deterministic_resumable_and_loads(home, monkeypatch, tmp_path):
    first = hashes(zoo.build("chainarith", "tiny", progress=False))
    assert {"target/model.safetensors", "draft/model.safetensors", "router/model.safetensors"} <= set(first)
    monkeypatch.setenv("SPECMM_HOME", str(tmp_path / "killed"))
    real = chainarith.train_causal_lm

    def killed(model, batches, config, workdir, **kw):
        def after_step(step):
            if step == 3 and workdir.name == "target":
                raise KeyboardInterrupt("simulated kill")
        return real(model, batches, config, workdir, after_step=after_step, **kw)

    monkeypatch.setattr(chainarith, "train_causal_lm", killed)
    with pytest.raises(KeyboardInterrupt):
        zoo.build("chainarith", "tiny", progress=False)
    monkeypatch.setattr(chainarith, "train_causal_lm", real)
    resumed = zoo.build("chainarith", "tiny", progress=False)
    assert hashes(resumed) == first
    models = chainarith.load(resumed)
    record = models.record
    assert record["models"]["draft"]["parameters"] < record["models"]["target"]["parameters"]
    assert {"heldout", "router"} <= set(record)
    problem = chainarith.heldout_problems(1)[0]
    out = StepSpeculator(models.target, models.draft, models.tokenizer, TargetOnly(),
                         delimiter=[models.tokenizer.convert_tokens_to_ids(STEP)]).generate([problem.prompt],
                                                                                          max_new_tokens=8)
    ids = torch.tensor([models.tokenizer.encode(problem.prompt)])
    reference = models.target.generate(ids, do_sample=False, max_new_tokens=8, eos_token_id=None, pad_token_id=0)
    assert out.completions[0] == reference[0, ids.shape[1]:].tolist()[: len(out.completions[0])]
