"""The forward side of diffusion decoding: full and prefix-cached logits of the generated region, counted.

Cache mode "prefix" (Fast-dLLM): when a row enters a block, one full forward refreshes that row's K/V of
everything before the block; later forwards in the block run only the window from the block start and
read the prefix K/V. The cache is replaced, never written in place, so candidate batches can share it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specmm.core.finite import check_finite
from specmm.core.stats import DiffusionExtras, GenerationStats
from specmm.diffusion_lm.model import PrefixCache, _positions
from specmm.diffusion_lm.selection import blocks

CACHE_MODES = (None, "prefix")


class Runner:
    """Logits [n, G, V] of the generated region for states of given input rows, with counting and caching.

    `stats` counts every batched model call as a target forward (each one yields the logits tokens are
    committed from) and the forwards each input row took part in.
    """

    def __init__(self, model, input_ids: Tensor, attention_mask: Tensor | None, gen_length: int, block_length: int,
                 cache: str | None):
        self.model, self.cache_mode, self.block_length = model, cache, block_length
        b, self.prompt_len = input_ids.shape
        pad = torch.ones(b, gen_length, dtype=torch.long, device=input_ids.device)
        self.attention_mask = None if attention_mask is None else torch.cat((attention_mask.long(), pad), dim=1)
        self.positions = _positions(self.attention_mask, torch.cat((input_ids, pad), dim=1))  # [B, L]
        self.cache: PrefixCache | None = None
        self.stats = GenerationStats(target_forwards_per_row=[0] * b, diffusion=DiffusionExtras())

    def _count(self, rows: Tensor, full: bool) -> None:
        self.stats.target_forwards += 1
        self.stats.diffusion.full_forwards += int(full)
        self.stats.diffusion.forward_rows += rows.numel()
        for r in rows.unique().tolist():
            self.stats.target_forwards_per_row[r] += 1

    def committed(self, counts: Tensor) -> None:
        """Record one iteration of rows that committed counts [n] tokens (>= 1 each): the first is the one
        stepwise decoding would commit, the rest are accepted drafts (`accepted_histogram[counts - 1]`)."""
        histogram, counts = self.stats.accepted_histogram, counts.tolist()
        if counts and min(counts) < 1:
            raise RuntimeError(f"a decoding iteration committed no token in a live row: {counts}")
        for c in counts:
            histogram.extend([0] * (c - len(histogram)))
            histogram[c - 1] += 1

    def _finite(self, logits: Tensor) -> Tensor:
        """logits [n, G, V], or NonFiniteError naming the model and the forward (the loop syncs per forward anyway)."""
        check_finite(logits.amax(-1), self.model, f"diffusion forward {self.stats.target_forwards}")
        return logits

    def _mask(self, rows: Tensor) -> Tensor | None:
        return None if self.attention_mask is None else self.attention_mask[rows]

    def block_start(self, x: Tensor) -> Tensor:
        """[n] sequence position where each state's current block starts (past the end when complete)."""
        masked = x[:, self.prompt_len:] == self.model.mask_id
        return self.prompt_len + blocks(masked, self.block_length)[1] * self.block_length

    def full(self, x: Tensor, rows: Tensor) -> Tensor:
        """Uncached forward of states x [n, L] of input rows `rows` [n]; refreshes their prefix cache."""
        self._count(rows, True)
        p = self.prompt_len
        if not getattr(self.model, "supports_cache", False):
            return self._finite(self.model.logits(x, self._mask(rows))[:, p:])
        logits, cache = self.model(x, self._mask(rows), self.positions[rows], logits_from=p,
                                   return_cache=self.cache_mode == "prefix")
        self._finite(logits)
        if cache is not None:
            cache.lengths = self.block_start(x)
            self.cache = cache if self.cache is None else self.cache.replace(rows, cache)
        return logits

    def cached(self, x: Tensor, rows: Tensor) -> Tensor:
        """Forward of states x [n, L] reading each row's prefix cache: only positions from the block start run."""
        self._count(rows, False)
        cache = self.cache.select(rows)
        start = int(cache.lengths.min())
        logits, _ = self.model(x[:, start:], self._mask(rows), self.positions[rows, start:], cache=cache,
                               start=start, logits_from=start)
        self._finite(logits)
        skipped = logits.new_zeros(logits.shape[0], start - self.prompt_len, logits.shape[-1])  # finished blocks
        return torch.cat((skipped, logits), dim=1)  # [n, G, V]

    def logits(self, x: Tensor, rows: Tensor) -> Tensor:
        """The reference forward of a state: cached inside a block, full (refresh) when a block starts."""
        if self.cache_mode is None or self.cache is None:
            return self.full(x, rows)
        fresh = self.block_start(x) != self.cache.lengths[rows]
        if bool(fresh.all()):
            return self.full(x, rows)
        if not bool(fresh.any()):
            return self.cached(x, rows)
        parts = {}
        for flag, fn in ((True, self.full), (False, self.cached)):
            idx = (fresh == flag).nonzero()[:, 0]
            parts[flag] = (idx, fn(x[idx], rows[idx]))
        out = parts[True][1].new_empty(x.shape[0], *parts[True][1].shape[1:])
        for idx, value in parts.values():
            out[idx] = value
        return out
