"""Exact token-level speculation inside a step the target regenerates (SpecReason+Decode).

The rows that regenerate are taken out of the core adapters as a sub-batch (`take_rows`: a view of their
per-row buffers) and the core's public round writes their step: `SpeculativeGenerator.step` with a chain of k
drafts and the exact rule, so every token is distributed exactly as the target's own sampling. The step
delimiter, EOS and the budget decide where each row's step ends (`StepEnd`). A row whose step has ended forgets
what its last round committed past the end and is taken back (`put_rows`): rows never run with masks, and each
row's draws come from its own generator whatever the other rows do. Behaviour log-probs are the target's
processed probabilities of each new token, read from the round's verify logits.

Both caches end as after `ModelState.generate_step` + commit: each holds the context and step[:-1], with
the step's last token as the pending tail.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specmm.core.engine import SpeculativeGenerator
from specmm.core.profiling import RoundTimer
from specmm.core.sampling import Generators, SamplingConfig, process_logits, select_generators
from specmm.core.tree import TreeSpec
from specmm.reasoning.state import ModelState, StepDraw
from specmm.reasoning.steps import StepDelimiter, StepEnd


def open_round(sub_target: ModelState, sub_draft: ModelState, k: int, timer=None) -> SpeculativeGenerator:
    """Ready a sub-batch for core rounds: the target commits its pending tail but the root, the drafter is fed
    the same context; `timer` (a running `PhaseTimer`) will get the rounds' draft time."""
    sub_target.commit_to_root()  # the round's root is each row's last context token
    sub_draft.owner.set_pending(sub_draft.pending, sub_draft.valid_pending())  # ends with the same root
    generator = SpeculativeGenerator(sub_target.owner, sub_draft.owner, tree=TreeSpec.chain(k))
    if timer is not None:
        generator.timer = RoundTimer(sub_target.device)
    return generator


def close_round(generator: SpeculativeGenerator, timer) -> None:
    """Charge the rounds' draft time to the draft (see `open_round`)."""
    if timer is not None and generator.timer is not None:
        timer.move(generator.timer.seconds["draft"], "draft")


def speculate_round(generator: SpeculativeGenerator, owners: tuple[ModelState, ModelState], rows: Tensor,
                    end: StepEnd, sampling: SamplingConfig, generators: Generators, tokens: Tensor,
                    logprobs: Tensor) -> Tensor:
    """One core round for the sub-batch `owners` (target, draft), whose row i is row rows[i] of `end`,
    `tokens` and `logprobs` (where each row's step is written); settles both caches to each row's step end.
    Returns which rows' steps ended [b]."""
    sub_target, sub_draft = owners
    out = generator.step(sub_target.last_pending()[:, 0], sampling, generators)
    sub_target.forwards += 1
    sub_target.count(torch.arange(rows.numel(), device=rows.device))  # every sub-batch row took part
    count = out.num_accepted + 1  # [b] new tokens: accepted drafts and the target's next token
    logits = out.target_logits.gather(1, out.path[:, :, None].expand(-1, -1, out.target_logits.shape[-1]))
    probs = process_logits(logits, sampling)  # [b, k+1, V] the distribution each new token came from
    new_logp = probs.gather(2, out.new_tokens[:, :, None])[:, :, 0].clamp_min(1e-45).log()  # [b, k+1]
    start = end.lengths[rows]  # [b]
    take, ended = end.take(out.new_tokens, count, rows)
    columns = start[:, None] + torch.arange(out.new_tokens.shape[1], device=rows.device)  # [b, k+1]
    tokens[rows[:, None], columns] = out.new_tokens  # junk past take is overwritten or cut
    logprobs[rows[:, None], columns] = new_logp.float()
    # settle: forget what the round committed past each row's step end (the tokens after `take`)
    last = out.new_tokens.gather(1, (take - 1)[:, None])  # [b, 1] each row's last context token
    sub_target.pending, sub_target.pending_count = out.next_token[:, None], torch.ones_like(count)
    sub_target.drop_last(count - take, last)
    drafter = sub_draft.owner
    sub_draft.pending, sub_draft.pending_count = drafter.pending, drafter.pending_valid.sum(1)
    sub_draft.drop_last(count - take, last)
    drafter.set_pending(sub_draft.pending, sub_draft.valid_pending())
    return ended


@torch.no_grad()
def speculate_step(target: ModelState, draft: ModelState, rows: Tensor, budget: Tensor, k: int,
                   sampling: SamplingConfig, generators: Generators, delimiter: StepDelimiter,
                   eos_ids: Tensor, timer=None) -> StepDraw:
    """One step for `rows` ([B] bool) by chain speculation of k draft tokens per target round; `generators`
    (the target's, one per row or shared) make every draw of a row's rounds. `timer`: see `open_round`."""
    batch, device = target.batch, target.device
    live = rows.nonzero().flatten()  # [b] original row of each sub-batch row
    width = int(budget[live].max()) + k + 1 if live.numel() else 0  # spare columns for a round past the end
    tokens = torch.zeros(batch, width, dtype=torch.long, device=device)
    logprobs = torch.zeros(batch, width, dtype=torch.float32, device=device)
    end = StepEnd(delimiter, eos_ids, budget)
    sub_target, sub_draft = target.take_rows(live), draft.take_rows(live)
    generator = None
    try:
        generator = open_round(sub_target, sub_draft, k, timer)
        row_gens = select_generators(generators, live.tolist())
        while live.numel():
            ended = speculate_round(generator, (sub_target, sub_draft), live, end, sampling, row_gens, tokens,
                                    logprobs)
            if bool(ended.any()):  # rows whose step has ended go back to the batch
                done, going = ended.nonzero().flatten(), (~ended).nonzero().flatten()
                everyone = not going.numel()
                target.put_rows(live[done], sub_target if everyone else sub_target.take_rows(done))
                draft.put_rows(live[done], sub_draft if everyone else sub_draft.take_rows(done))
                if everyone:
                    break
                sub_target.select_rows(going)
                sub_draft.select_rows(going)
                live, row_gens = live[going], select_generators(row_gens, going.tolist())
    finally:
        if generator is not None:
            close_round(generator, timer)
        draft.forwards += sub_draft.owner.draft_forwards
        target.forwards += sub_target.forwards
        sub_target.close()
        sub_draft.close()
    lengths = end.lengths  # [B]
    keep = torch.arange(width, device=device)[None, :] < lengths[:, None]
    done = int(lengths.max()) if batch else 0
    tokens, logprobs = torch.where(keep, tokens, 0)[:, :done], torch.where(keep, logprobs, 0.0)[:, :done]
    return StepDraw(tokens, lengths, logprobs, torch.zeros_like(logprobs), None, end.eos)
