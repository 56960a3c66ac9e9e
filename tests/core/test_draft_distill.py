"""Draft distillation: the loss's literal values, that distilling moves a draft towards its target (KL down,
greedy agreement up), exact resume, and refusals before any step."""

from __future__ import annotations

import copy

import pytest
import torch

import specmm
from specmm.core.draft_distill import DistillConfig, distill_draft, distillation_loss, heldout_comparison, text_windows
from specmm.drafters import ModelDrafter
from tests.conftest import tiny_model

VOCAB = 32


def _pair():
    target = tiny_model("llama", seed=0, dtype=torch.float32, vocab=VOCAB, logit_scale=4.0)
    draft = tiny_model("llama", seed=1, dtype=torch.float32, vocab=VOCAB, num_hidden_layers=1, hidden_size=16,
                       intermediate_size=32, num_attention_heads=2, num_key_value_heads=1)
    return target, draft


def _stream(length: int = 4000, seed: int = 0) -> torch.Tensor:
    return torch.randint(1, VOCAB, (length,), generator=torch.Generator().manual_seed(seed))


def test_loss_table():
    # logits [1, 3, 2]: position 0 equal, position 1 draft prefers the other token, position 2 masked out
    target = torch.tensor([[[0.0, 0.0], [2.0, 0.0], [9.0, -9.0]]])
    draft = torch.tensor([[[0.0, 0.0], [0.0, 2.0], [-9.0, 9.0]]])
    mask = torch.tensor([[1, 1, 0]])
    p = torch.tensor([2.0, 0.0]).softmax(-1)
    expected = (p * (p.log() - torch.tensor([0.0, 2.0]).log_softmax(-1))).sum() / 2
    loss, agree = distillation_loss(draft, target, mask)
    torch.testing.assert_close(loss, expected)
    assert agree.item() == pytest.approx(0.5)  # position 0 ties resolve to token 0 in both; position 1 disagrees
    same, full = distillation_loss(target, target, torch.ones(1, 3))
    assert same.item() == pytest.approx(0.0, abs=1e-6) and full.item() == 1.0
    hot, _ = distillation_loss(draft, target, mask, temperature=2.0)
    assert hot.item() != pytest.approx(loss.item())


def test_distilling_moves_the_draft_towards_the_target():
    target, draft = _pair()
    heldout = text_windows(_stream(seed=9), 8, 24, seed=3)(0)
    before = heldout_comparison(draft, target, heldout)
    tops = []
    distill_draft(draft, target, text_windows(_stream(), 16, 24), DistillConfig(steps=60, lr=1e-2, warmup_steps=5),
                  progress=False, on_step=lambda step, loss, parts: tops.append(parts["top1"]))
    after = heldout_comparison(draft, target, heldout)
    assert len(tops) == 60
    assert after["kl"] < 0.6 * before["kl"]
    assert after["top1_agreement"] > before["top1_agreement"] + 0.15
    assert not draft.training and not target.training


def test_a_distilled_draft_stays_lossless():
    target, draft = _pair()
    distill_draft(draft, target, text_windows(_stream(), 8, 16), DistillConfig(steps=5), progress=False)
    prompt = torch.randint(1, VOCAB, (2, 7), generator=torch.Generator().manual_seed(4))
    out = specmm.SpeculativeGenerator(target, ModelDrafter(draft), tree=specmm.TreeSpec.chain(3)).generate(
        prompt, max_new_tokens=12, pad_token_id=0)
    reference = target.generate(prompt, max_new_tokens=12, min_new_tokens=12, do_sample=False, pad_token_id=0)
    assert torch.equal(out.sequences[:, :reference.shape[1]], reference)


def test_resume_ends_with_the_weights_of_an_uninterrupted_run(tmp_path):
    target, draft = _pair()
    windows, config = text_windows(_stream(), 4, 16), DistillConfig(steps=6, checkpoint_every=3, lr=1e-2)
    whole = copy.deepcopy(draft)
    distill_draft(whole, target, windows, config, progress=False)

    halves = copy.deepcopy(draft)
    distill_draft(halves, target, windows, DistillConfig(steps=3, checkpoint_every=3, lr=1e-2),
                  checkpoint_dir=tmp_path, progress=False)
    resumed = copy.deepcopy(draft)  # a fresh process: the initial weights, then the checkpoint
    losses = distill_draft(resumed, target, windows, config, checkpoint_dir=tmp_path, progress=False)
    assert len(losses) == 3
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name
    assert (tmp_path / "config.json").is_file()  # the checkpoint folder loads as a model


def test_a_list_of_batches_is_taken_in_turn_with_masks():
    target, draft = _pair()
    ids = torch.randint(1, VOCAB, (2, 10), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # left padding carries no loss
    seen = []
    distill_draft(draft, target, [(ids, mask), ids], DistillConfig(steps=3), progress=False,
                  on_step=lambda step, loss, parts: seen.append(step))
    assert seen == [0, 1, 2]


def test_refusals_before_any_step():
    target, draft = _pair()
    other = tiny_model("llama", seed=1, dtype=torch.float32, vocab=VOCAB + 8)
    before = copy.deepcopy(other.state_dict())
    with pytest.raises(ValueError, match="vocabulary"):
        distill_draft(other, target, text_windows(_stream(), 2, 8), DistillConfig(steps=2), progress=False)
    assert all(torch.equal(before[k], v) for k, v in other.state_dict().items())
    with pytest.raises(ValueError, match="no batches"):
        distill_draft(draft, target, [], DistillConfig(steps=2), progress=False)
    with pytest.raises(ValueError, match="temperature"):
        DistillConfig(temperature=0.0)
    with pytest.raises(ValueError, match="longer than"):
        text_windows(torch.arange(10), 2, 16)
