"""Near-ties: whether a speculative row's tokens part from plain decoding only where the target itself barely chose.

In bfloat16 (or float16) a verify over many tokens and a one-token decoding step sum in different orders, so their
logits differ in the last bits, and greedy decoding may pick the other of two almost equal tokens. From there the
two continuations are both the target's greedy text under a rounding. A benchmark then reports such a row as a tie,
not as a mismatch, when the target's own logits at the first differing position (one forward over the common
prefix, in the target's dtype) put the two tokens within the rounding of that precision. When the target's
`generation_config` asks for logits processors (a repetition penalty, say), the logits compared are the processed
scores HF `generate` picks its token from, since those are what the two decodings chose between.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

# relative gap (of the largest logit's magnitude) that summation order alone can produce at each precision
RELATIVE_GAP = {torch.bfloat16: 2.0 ** -6, torch.float16: 2.0 ** -9, torch.float32: 2.0 ** -16,
                torch.float64: 2.0 ** -40}

TieJudge = Callable[[int, list[int], list[int]], bool]
"""`judge(row, reference tokens, tokens) -> bool`: the row's first difference is a near-tie of the target."""


def first_difference(reference: list[int], tokens: list[int]) -> int | None:
    """Index of the first position where both rows hold different tokens (None: equal, or one is a prefix)."""
    for index, (expected, got) in enumerate(zip(reference, tokens)):
        if expected != got:
            return index
    return None


def logit_tie_judge(model: nn.Module, input_ids: Tensor, attention_mask: Tensor,
                    relative_gap: float | None = None) -> TieJudge:
    """A `TieJudge` over a causal LM's prompts (input_ids, attention_mask [B, L], left padded): the two tokens at the
    first difference are within `relative_gap` (default: `RELATIVE_GAP` of the model's dtype) of the largest logit."""
    dtype = next(model.parameters()).dtype
    gap_allowed = RELATIVE_GAP.get(dtype, RELATIVE_GAP[torch.bfloat16]) if relative_gap is None else relative_gap

    @torch.no_grad()
    def judge(row: int, reference: list[int], tokens: list[int]) -> bool:
        index = first_difference(reference, tokens)
        if index is None:  # equal, or one stopped earlier with no token of its own to compare: not a tie
            return False
        prompt = input_ids[row][attention_mask[row].bool()]
        prefix = torch.cat([prompt, prompt.new_tensor(reference[:index])])[None]
        logits = (processed_next_scores(model, prefix, index) if processed else model(input_ids=prefix).logits[0, -1])
        logits = logits.float()  # [V]
        finite = logits[logits.isfinite()]  # tokens a rule bans (-inf) say nothing of the logits' scale
        scale = max(finite.abs().max().item() if finite.numel() else 0.0, 1.0)
        return bool((logits[reference[index]] - logits[tokens[index]]).abs() <= gap_allowed * scale)

    processed = _has_processors(model)
    return judge


def _has_processors(model: nn.Module) -> bool:
    from specmm.core.processors import TreeLogitsProcessor

    config = getattr(model, "generation_config", None)
    eos = getattr(config, "eos_token_id", None)
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    return TreeLogitsProcessor.from_model(model, eos) is not None


def processed_next_scores(model: nn.Module, prefix: Tensor, new_tokens: int) -> Tensor:
    """[V] the processed scores HF `generate` picks the next token from after `prefix` [1, L], whose last
    `new_tokens` tokens were generated (the rules that count new tokens count from the original prompt)."""
    config = model.generation_config
    overrides = {}
    if config.min_new_tokens:
        overrides["min_new_tokens"] = max(0, config.min_new_tokens - new_tokens)
    if new_tokens and config.begin_suppress_tokens is not None:
        overrides["begin_suppress_tokens"] = None  # they apply to the first new token only
    out = model.generate(input_ids=prefix, attention_mask=torch.ones_like(prefix), max_new_tokens=1, do_sample=False,
                         output_scores=True, return_dict_in_generate=True, **overrides)
    return out.scores[0][0]


def count_ties(reference: list[list[int]], rows: list[list[int]], judge: TieJudge) -> tuple[int, int]:
    """(rows that differ from the reference, of them those whose first difference the judge calls a near-tie)."""
    differing = [i for i, (expected, got) in enumerate(zip(reference, rows)) if expected != got]
    missing = abs(len(reference) - len(rows))  # rows only one side has: they differ, and there is nothing to judge
    return len(differing) + missing, sum(judge(i, reference[i], rows[i]) for i in differing)


__all__ = ["RELATIVE_GAP", "TieJudge", "count_ties", "first_difference", "logit_tie_judge", "processed_next_scores"]
