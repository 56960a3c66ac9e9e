"""Exact token-level speculation inside a step the target regenerates (SpecReason+Decode).

The draft proposes k tokens, the target scores them in one round, the core's exact rule accepts a prefix
and draws the next token (bonus, or from the residual), so every token is distributed exactly as the
target's own sampling. Both caches are settled as after `ModelState.generate_step` + commit: each holds
the context and step[:-1], with the step's last token as the pending tail.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specmm.core.acceptance import EXACT
from specmm.core.sampling import Generators, SamplingConfig, normalize, process_logits
from specmm.reasoning.state import ModelState, StepDraw, draw_tokens, pack
from specmm.reasoning.steps import StepDelimiter


def _coins(batch: int, k: int, rows: list[int], generators: Generators, device) -> Tensor:
    """[B, k] uniforms; only `rows` draw (each from its own generator when one is given per row)."""
    if generators is None or isinstance(generators, torch.Generator):
        return torch.rand(batch, k, generator=generators, device=device)
    coins = torch.ones(batch, k, device=device)
    for b in rows:
        coins[b] = torch.rand(k, generator=generators[b], device=device)
    return coins


@torch.no_grad()
def speculate_step(target: ModelState, draft: ModelState, rows: Tensor, budget: Tensor, k: int,
                   sampling: SamplingConfig, target_gens: Generators, draft_gens: Generators,
                   delimiter: StepDelimiter, eos_ids: Tensor) -> StepDraw:
    """One step for `rows` ([B] bool) by chain speculation of k draft tokens per target round."""
    batch, device = target.batch, target.device
    index = torch.arange(batch, device=device)
    width = int(budget[rows].max()) if bool(rows.any()) else 0
    tokens = torch.zeros(batch, width, dtype=torch.long, device=device)
    logprobs = torch.zeros(batch, width, dtype=torch.float32, device=device)
    lengths = torch.zeros(batch, dtype=torch.long, device=device)
    eos_hit = torch.zeros(batch, dtype=torch.bool, device=device)
    live, tails = rows.clone(), delimiter.start(batch)
    steps = torch.arange(k + 1, device=device)
    while bool(live.any()):
        live_rows = live.nonzero().flatten().tolist()
        # draft a chain of k tokens (the last one is not run)
        out, last = draft.run_pending(live)
        logits = out.logits[index, last]  # [B, V]
        drafts = torch.zeros(batch, k, dtype=torch.long, device=device)
        draft_probs = []
        for j in range(k):
            probs = process_logits(logits, sampling)  # [B, V]
            draft_probs.append(probs)
            drafts[:, j] = torch.where(live, draw_tokens(probs, live_rows, draft_gens, sampling.greedy), 0)
            if j + 1 < k:
                logits = draft.run(drafts[:, j: j + 1], live[:, None]).logits[:, 0]
        draft_probs = torch.stack(draft_probs, 1)  # [B, k, V]
        # the target scores pending + drafts in one round
        pending_count = torch.where(live, target.pending_count, 0)
        run_tokens, valid = pack([(target.pending, pending_count), (drafts, torch.where(live, k, 0))])
        logits = target.run(run_tokens, valid).logits  # [B, W, V]
        positions = ((target.pending_count - 1).clamp_min(0)[:, None] + steps).clamp(max=logits.shape[1] - 1)
        target_probs = process_logits(logits.gather(1, positions[:, :, None].expand(-1, -1, logits.shape[-1])),
                                      sampling)  # [B, k+1, V] after the root and each draft
        if sampling.greedy:
            ok = target_probs[:, :k].argmax(-1) == drafts
        else:
            accept = EXACT.accept_probability(target_probs[:, :k].flatten(0, 1), draft_probs.flatten(0, 1),
                                              drafts.flatten()).view(batch, k)
            ok = _coins(batch, k, live_rows, target_gens, device) < accept
        accepted = ok.long().cumprod(1).sum(1)  # [B]
        at = target_probs[index, accepted]  # [B, V] distribution of the next token
        if not sampling.greedy:
            rejected = accepted < k
            slot = accepted.clamp(max=k - 1)
            residual = normalize(EXACT.reject(at, draft_probs[index, slot], drafts[index, slot]))
            residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, at)
            at = torch.where(rejected[:, None], residual, at)
        following = draw_tokens(at, live_rows, target_gens, sampling.greedy)
        new = torch.cat([drafts, drafts.new_zeros(batch, 1)], 1).scatter(1, accepted[:, None], following[:, None])
        new_logp = target_probs.gather(2, new[:, :, None])[:, :, 0].clamp_min(1e-45).log()  # [B, k+1]
        # keep tokens up to a delimiter, EOS or the budget
        take = torch.zeros(batch, dtype=torch.long, device=device)
        going, stopped = live.clone(), torch.zeros_like(live)
        for j in range(k + 1):
            going = going & (j <= accepted) & ~stopped
            going_rows = going.nonzero().flatten().tolist()
            if not going_rows:
                break
            token = new[:, j]
            spot = lengths.clamp(max=width - 1)
            tokens[index, spot] = torch.where(going, token, tokens[index, spot])
            logprobs[index, spot] = torch.where(going, new_logp[:, j].float(), logprobs[index, spot])
            lengths += going.long()
            take += going.long()
            is_eos = torch.isin(token, eos_ids) & going
            eos_hit |= is_eos
            stopped |= going & (is_eos | delimiter.ends(token, going_rows, tails) | (lengths >= budget))
        # settle: each cache keeps pending + new[:take-1]; new[take-1] is the next pending tail
        tail = new.gather(1, (take - 1).clamp_min(0)[:, None])
        one = torch.ones_like(take)
        target_keep = torch.where(live, target.pending_count + take - 1, 0)
        tail_t, count_t = _where(live, (tail, one), (target.pending, target.pending_count))
        target.close_round(target_keep, tail_t, count_t)
        ran = (take - 1).clamp(max=k - 1)  # kept tokens the draft already ran
        draft_keep = torch.where(live, draft.pending_count + ran, 0)
        rest = torch.stack([new[index, ran], new[index, (ran + 1).clamp(max=k)]], 1)  # [B, 2]
        rest_count = torch.where(take - 1 > ran, 2, 1)
        tail_d, count_d = _where(live, (rest, rest_count), (draft.pending, draft.pending_count))
        draft.close_round(draft_keep, tail_d, count_d)
        live = live & ~stopped
    return StepDraw(tokens, lengths, logprobs, torch.zeros_like(logprobs), None, eos_hit)


def _where(cond: Tensor, first: tuple[Tensor, Tensor], second: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    width = max(first[0].shape[1], second[0].shape[1])
    a = torch.nn.functional.pad(first[0], (0, width - first[0].shape[1]))
    b = torch.nn.functional.pad(second[0], (0, width - second[0].shape[1]))
    return torch.where(cond[:, None], a, b), torch.where(cond, first[1], second[1])
