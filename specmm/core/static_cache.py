"""`StaticRowCache`: the `RowCache` bookkeeping over preallocated HF `StaticLayer`s, for compiled rounds.

Every buffer keeps its shape and address for the whole generation, so a compiled forward is reused round
after round. Row b's committed tokens sit in slots [0, lengths[b]) (slot s holds position s). A round's
slots are written from the shared *round start* P = max(lengths) on: `StaticLayer` writes at its own
`cumulative_length`, which is set to P in place when a round opens. `commit` gathers each row's kept round
slots to the end of its committed region; everything past a row's length is stale and masked, never
copied around. Nothing here reads a tensor value on the host: P lives on the device.

Masks cover the whole buffer ([B, 1, n, max_len]), as HF expects with static caches.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers.cache_utils import Cache, StaticLayer

from specmm.core.cache import RowCache


def static_cache_length(needed: int, bucket: int = 128) -> int:
    """Round a slot count up to a bucket, so generations of similar length share one compiled shape."""
    return -(-needed // bucket) * bucket


class StaticRowCache(RowCache):
    """Per-row lengths and an open round over a `Cache` of `StaticLayer`s with `max_len` slots."""

    def __init__(self, batch: int, device: torch.device, num_layers: int, max_len: int, reserve: int = 0):
        self.cache = Cache(layers=[StaticLayer(max_len) for _ in range(num_layers)])
        self.max_len = max_len
        self.longest = max_len - reserve  # a row's committed length never passes this: one round always fits
        self.lengths = torch.zeros(batch, dtype=torch.long, device=device)  # [B] committed tokens per row
        self.round_start = torch.zeros((), dtype=torch.long, device=device)  # P = max(lengths), on the device
        self.slots = torch.arange(max_len, device=device)  # [S]
        self._round_positions: list[Tensor] = []
        self._round_attend: Tensor | None = None

    @property
    def committed_length(self) -> int:
        raise AttributeError("StaticRowCache keeps its committed length on the device (round_start)")

    @property
    def physical_length(self) -> int:
        return self.max_len

    @property
    def allocated(self) -> bool:
        """Whether HF has allocated the layers (on the first forward, which therefore runs eager)."""
        return all(layer.is_initialized for layer in self.cache.layers)

    def _round_index(self) -> tuple[Tensor, Tensor]:
        """[S] index of each slot inside the open round (clamped) and [S] whether the slot is a round slot."""
        relative = self.slots - self.round_start
        inside = (relative >= 0) & (relative < self.round_length)
        return relative.clamp(0, max(self.round_length - 1, 0)), inside

    def open_slots(self, positions: Tensor, attend: Tensor) -> Tensor:
        """Register n new round slots; returns the [B, 1, n, S] bool mask for running them.

        positions: [B, n]; attend: [B, n, R + n] which round slots (earlier ones, then the new) each sees.
        """
        batch, n = positions.shape
        if self.round_length == 0:  # a round opens: its slots start at P
            for layer in self.cache.layers:
                layer.cumulative_length.copy_(self.round_start)
        self._round_positions.append(positions)
        previous = self._round_attend
        self._round_attend = attend if previous is None else torch.cat(
            [torch.cat([previous, attend.new_zeros(batch, previous.shape[1], n)], -1), attend], 1)
        index, inside = self._round_index()
        sees_round = attend.gather(2, index.expand(batch, n, -1)) & inside  # [B, n, S]
        sees_committed = (self.slots[None, :] < self.lengths[:, None])[:, None, :]  # [B, 1, S]
        return (sees_committed | sees_round)[:, None]

    def windowed(self, mask: Tensor, window: int) -> Tensor:
        """Restrict a [B, 1, n, S] mask from `open_slots` to keys less than `window` positions back."""
        batch = mask.shape[0]
        index, inside = self._round_index()
        round_positions = torch.cat(self._round_positions, 1).gather(1, index.expand(batch, -1))  # [B, S]
        keys = torch.where(inside, round_positions, self.slots)  # [B, S] position of every slot
        queries = self._round_positions[-1]  # [B, n]
        return mask & (queries[:, :, None] - keys[:, None, :] < window)[:, None]

    def commit(self, slots: Tensor, counts: Tensor) -> None:
        """Keep round slots `slots[b, :counts[b]]` for row b (in that order); drop the rest of the round."""
        slots = slots[:, : self.round_length]
        batch, m = slots.shape
        if m:
            source = self.round_start + slots  # [B, m]
            target = (self.lengths[:, None] + torch.arange(m, device=slots.device)).clamp(max=self.max_len - 1)
            for layer in self.cache.layers:
                if not layer.is_initialized:
                    continue
                for states in (layer.keys, layer.values):  # [B, H, S, Dh]
                    heads, dim = states.shape[1], states.shape[3]
                    kept = states.gather(2, source[:, None, :, None].expand(batch, heads, m, dim))
                    states.scatter_(2, target[:, None, :, None].expand(batch, heads, m, dim), kept)
        # live rows never reach `longest` (the plan reserves their budget); rows that stopped but stay in a
        # compiled batch keep committing their root and are held there, their slots being junk nobody reads
        torch.clamp(self.lengths + counts, max=self.longest, out=self.lengths)
        self._close_round()

    def rollback(self) -> None:
        """Drop every round slot."""
        self._close_round()

    def select_rows(self, rows: Tensor) -> None:
        """Keep only `rows` (new buffers: compiled shapes change with the batch width)."""
        for layer in self.cache.layers:
            if layer.is_initialized:
                layer.keys, layer.values = layer.keys[rows], layer.values[rows]
                layer.batch_size = rows.numel()
        self.lengths = self.lengths[rows]
        self._close_round()

    def _close_round(self) -> None:
        self.round_start.copy_(self.lengths.max() if self.lengths.numel() else 0)
        for layer in self.cache.layers:
            layer.cumulative_length.copy_(self.round_start)
        self._round_positions = []
        self._round_attend = None

    def _truncate(self, length: int) -> None:  # the dynamic cache's crop has no meaning here
        self._close_round()
