"""Where a reasoning step ends: a delimiter (token ids or a string), EOS, or the step token budget.

String delimiters are found on the new tokens as they are sampled, from a per-id text table (no
re-tokenising of the context, which would change ids): a token ends the step when the text of the step so
far, ending with it, first contains the delimiter, so BPE merges such as ".\\n\\n" or "\\n\\n\\n" count too.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor


class StepDelimiter:
    """Step boundaries from `delimiter` (a string, or a set of token ids) and `max_step_tokens`."""

    def __init__(self, delimiter: str | Iterable[int], tokenizer=None, max_step_tokens: int = 256):
        if isinstance(max_step_tokens, bool) or not isinstance(max_step_tokens, int) or max_step_tokens < 1:
            raise ValueError(f"max_step_tokens: expected an integer >= 1, got {max_step_tokens!r}")
        self.max_step_tokens = max_step_tokens
        self.text: str | None = None
        self.token_text: list[str] | None = None
        if isinstance(delimiter, str):
            if tokenizer is None:
                raise ValueError("delimiter: a string delimiter needs the tokenizer")
            if not delimiter or not tokenizer.encode(delimiter, add_special_tokens=False):
                raise ValueError(f"delimiter: {delimiter!r} encodes to no tokens with this tokenizer")
            self.text = delimiter
            vocab = len(tokenizer)
            self.token_text = [tokenizer.decode([i]) for i in range(vocab)]
            ids = [i for i, t in enumerate(self.token_text) if delimiter in t]
        else:
            ids = sorted({int(i) for i in delimiter})
            if not ids:
                raise ValueError("delimiter: an empty set of token ids marks no step boundary")
            if min(ids) < 0 or (tokenizer is not None and max(ids) >= len(tokenizer)):
                raise ValueError(f"delimiter: token ids {ids} are outside the tokenizer's vocabulary")
        self.ids = torch.tensor(ids, dtype=torch.long)  # tokens that end a step on their own

    def start(self, batch: int) -> list[str]:
        """Per-row text tails for a new step (only string delimiters use them)."""
        return [""] * batch

    def ends(self, tokens: Tensor, rows: list[int], tails: list[str]) -> Tensor:
        """[B] bool: does token tokens[b] close the step of row b (for b in `rows`; others False)."""
        hit = torch.isin(tokens, self.ids.to(tokens.device))
        if self.text is None:
            return hit
        found = torch.zeros_like(hit)
        keep = len(self.text) - 1
        values = tokens.tolist()
        for b in rows:
            window = tails[b] + self.token_text[values[b]]
            found[b] = self.text in window
            tails[b] = window[-keep:] if keep else ""
        return found


class StepEnd:
    """Where each row's current step ends: after a delimiter or EOS token, or at the row's token budget.

    Keeps per-row state for one step (tokens so far, the delimiter's text tail), so new tokens can come in
    blocks of any size: one sampled token, or the accepted tokens of a speculative round.
    """

    def __init__(self, delimiter: StepDelimiter, eos_ids: Tensor, budget: Tensor):
        self.delimiter, self.eos_ids, self.budget = delimiter, eos_ids, budget  # budget: [B] tokens per row
        self.lengths = torch.zeros_like(budget)  # [B] step tokens so far
        self.eos = torch.zeros_like(budget, dtype=torch.bool)  # [B] the step ended with EOS
        self.tails = delimiter.start(budget.shape[0])

    def take(self, tokens: Tensor, counts: Tensor, rows: Tensor) -> tuple[Tensor, Tensor]:
        """Feed new tokens [b, n] of `rows` [b] (their first counts[b] are real) -> (take [b]: how many
        belong to the step, through the one that ends it; ended [b] bool: the step has ended)."""
        take = torch.zeros_like(counts)
        ended = torch.zeros_like(counts, dtype=torch.bool)
        lengths, budget = self.lengths[rows], self.budget[rows]
        row_list = rows.tolist()
        tails = [self.tails[r] for r in row_list]
        eos_ids = self.eos_ids.to(tokens.device)
        for j in range(tokens.shape[1]):
            going = (j < counts) & ~ended & (lengths < budget)
            going_rows = going.nonzero().flatten().tolist()
            if not going_rows:
                break
            token = tokens[:, j]
            take += going.long()
            lengths = lengths + going.long()
            is_eos = torch.isin(token, eos_ids) & going
            self.eos[rows] |= is_eos
            ended |= going & (is_eos | self.delimiter.ends(token, going_rows, tails) | (lengths >= budget))
        self.lengths[rows] = lengths
        for r, tail in zip(row_list, tails):
            self.tails[r] = tail
        return take, ended

    def restart(self, rows: Tensor, budget: Tensor) -> None:
        """Begin a new step for `rows` [b] with budget [b] tokens (the row-asynchronous schedule reuses one
        StepEnd over its slots)."""
        self.budget, self.lengths, self.eos = self.budget.clone(), self.lengths.clone(), self.eos.clone()
        self.budget[rows], self.lengths[rows], self.eos[rows] = budget, 0, False
        for r in rows.tolist():
            self.tails[r] = ""

    def select(self, rows: Tensor) -> None:
        """Keep only `rows` [b] (finished rows leave the batch)."""
        self.budget, self.lengths, self.eos = self.budget[rows], self.lengths[rows], self.eos[rows]
        self.tails = [self.tails[r] for r in rows.tolist()]
