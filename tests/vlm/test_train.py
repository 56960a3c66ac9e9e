"""ViSpec's stage-2 loss: the teacher-forced pass and `vispec_unroll_steps` self-fed passes, each pass reading
the features the pass before it predicted (upstream `mtp_steps`), averaged."""

from __future__ import annotations

import pytest
import torch

from specmm.core.target import PrefillOutput
from specmm.vlm import VisionDrafter
from specmm.vlm.drafter import IMAGE_MASK
from specmm.vlm.train import DrafterTrainConfig, drafter_loss, rank_loss, run_target
from tests.vlm.test_targets import llava_inputs, tiny_llava


def stage2_term(drafter, hidden, target_logits, weight) -> torch.Tensor:
    """10 L1(probabilities) + 0.1 rank, averaged over the weighted slots."""
    logits = drafter.lm_head(hidden)
    l1 = (logits.softmax(-1) - target_logits.softmax(-1)).abs().sum(-1)
    per_slot = 10.0 * l1 + 0.1 * rank_loss(logits, target_logits, 10)
    return (per_slot * weight).sum() / weight.sum()


def test_each_self_fed_pass_reads_the_previous_pass_and_passes_are_averaged():
    model = tiny_llava()
    batch = llava_inputs(model)
    torch.manual_seed(1)
    drafter = VisionDrafter.for_target(model, method="vispec")
    with torch.no_grad():  # off the identity init, so the global vector and the unrolls matter
        for p in drafter.head.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    passed = run_target(model, batch)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    with torch.no_grad():
        losses = [drafter_loss(drafter, passed, batch, "multimodal",
                               DrafterTrainConfig(feature_noise=0.0, vispec_unroll_steps=n))[0] for n in range(3)]

        # the passes by hand: pass i + 1 reads pass i's predicted features where the slot before ran
        truth = passed.features[:, :-1]
        prefill = PrefillOutput(truth, passed.inputs_embeds[:, :-1], {IMAGE_MASK: passed.image_mask[:, :-1]})
        out, kept = drafter.teacher_forced(ids, mask, prefill)
        weight = (kept & ~passed.image_mask[:, 1:] & mask[:, 1:].bool()).double()
        target_logits = drafter.lm_head(passed.features[:, 1:])
        hidden, terms = out.last_hidden_state, []
        for _ in range(3):
            terms.append(stage2_term(drafter, hidden, target_logits, weight))
            own = torch.where(kept[:, :-1, None], hidden[:, :-1], truth[:, 1:])
            fed = PrefillOutput(torch.cat([truth[:, :1], own], 1), prefill.inputs_embeds, prefill.extras)
            hidden = drafter.teacher_forced(ids, mask, fed)[0].last_hidden_state
    assert len({round(t.item(), 6) for t in terms}) == 3  # the passes see different inputs
    for n, loss in enumerate(losses):  # the loss is float32
        torch.testing.assert_close(loss, (sum(terms[: n + 1]) / (n + 1)).float(), rtol=1e-5, atol=1e-6)


def test_negative_unroll_steps_are_refused():
    with pytest.raises(ValueError, match="vispec_unroll_steps"):
        DrafterTrainConfig(vispec_unroll_steps=-1)
