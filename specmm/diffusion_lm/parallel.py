"""Forward-per-step decoders: stepwise (the reference) and the lossy parallel baselines.

Each step runs one forward of every unfinished row and commits a set of masked positions chosen by a
commit rule: stepwise = f(state) only; LLaDA low-confidence remasking = the k most confident of the
block; Fast-dLLM threshold = every position with confidence >= threshold (at least f); Prophet = stepwise
until the answer looks settled, then every remaining mask at once.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from specmm.diffusion_lm.runner import Runner
from specmm.diffusion_lm.selection import eligible, scores, select

# (confidence [n, G], tokens [n, G], masked [n, G], logits [n, G, V], step) -> positions to commit [n, G]
CommitRule = Callable[[Tensor, Tensor, Tensor, Tensor, int], Tensor]


def stepwise_rule(block_length: int) -> CommitRule:
    def rule(conf, tokens, masked, logits, step):
        pos, _, valid = select(conf, tokens, masked, block_length)
        return torch.zeros_like(masked).scatter(1, pos[:, None], valid[:, None])
    return rule


def top_k_rule(block_length: int, k: int) -> CommitRule:
    """LLaDA's low-confidence remasking with k tokens per step (k = 1 is stepwise)."""
    def rule(conf, tokens, masked, logits, step):
        allowed = eligible(masked, block_length)
        order = torch.sort(torch.where(allowed, conf, -torch.inf), dim=-1, descending=True, stable=True).indices
        chosen = torch.zeros_like(masked).scatter(1, order[:, :k], True)
        return chosen & allowed
    return rule


def threshold_rule(block_length: int, threshold: float) -> CommitRule:
    """Fast-dLLM's parallel decoding: every eligible position with confidence >= threshold, at least f."""
    first = stepwise_rule(block_length)

    def rule(conf, tokens, masked, logits, step):
        return (eligible(masked, block_length) & (conf >= threshold)) | first(conf, tokens, masked, logits, step)
    return rule


def prophet_rule(block_length: int, gen_length: int, thresholds: tuple[float, float, float]) -> CommitRule:
    """Prophet's early commit: when the mean top-1 minus top-2 raw-logit gap over the remaining masks reaches
    the threshold of the current progress third (7.5 / 5.0 / 2.5 by default), fill every mask with its argmax."""
    first = stepwise_rule(block_length)

    def rule(conf, tokens, masked, logits, step):
        two = logits.float().topk(2, dim=-1).values  # [n, G, 2]
        gap = ((two[..., 0] - two[..., 1]) * masked).sum(-1) / masked.sum(-1).clamp_min(1)  # [n]
        progress = 1.0 - masked.sum(-1) / gen_length  # [n]
        bound = torch.where(progress < 1 / 3, thresholds[0],
                            torch.where(progress < 2 / 3, thresholds[1], thresholds[2]))
        return torch.where((gap >= bound)[:, None], masked, first(conf, tokens, masked, logits, step))
    return rule


@torch.no_grad()
def decode_parallel(runner: Runner, x: Tensor, rule: CommitRule, confidence: str) -> Tensor:
    """Run `rule` step by step until no mask is left; x [B, L] is updated and returned."""
    p, mask_id = runner.prompt_len, runner.model.mask_id
    rows = torch.arange(x.shape[0], device=x.device)
    step = 0
    while rows.numel():
        logits = runner.logits(x[rows], rows)  # [n, G, V]
        gen = x[rows, p:]
        masked = gen == mask_id
        conf, tokens = scores(logits, mask_id, confidence)
        commit = rule(conf, tokens, masked, logits, step) & masked
        x[rows, p:] = torch.where(commit, tokens, gen)
        runner.committed(commit.sum(-1))
        rows = rows[(x[rows, p:] == mask_id).any(-1)]
        step += 1
    return x
