"""`StaticRowCache`: the `RowCache` bookkeeping over preallocated HF `StaticLayer`s, for the fast mode's rounds.

Every buffer keeps its shape and address for the whole generation, so a compiled forward is reused round
after round. Row b's committed tokens sit in slots [0, lengths[b]) (slot s holds position s). A round's
slots are written from the shared *round start* P = max(lengths) on: `StaticLayer` writes at its own
`cumulative_length`, which is set to P in place when a round opens. `commit` gathers each row's kept round
slots to the end of its committed region; everything past a row's length is stale and masked, never
copied around. Nothing here reads a tensor value on the host: P lives on the device.

Masks cover the whole buffer ([B, 1, n, max_len]), as HF expects with static caches.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor
from transformers.cache_utils import Cache, StaticLayer

from specmm.core.cache import RowCache
from specmm.core.compiled import StaticPlan, compiles
from specmm.core.resident import resident
from specmm.core.inplace import move_slots_


def round_index(slots: Tensor, round_start: Tensor, round_length: int) -> tuple[Tensor, Tensor]:
    """[S] index of each slot inside the open round (clamped) and [S] whether the slot is a round slot."""
    relative = slots - round_start
    inside = (relative >= 0) & (relative < round_length)
    return relative.clamp(0, max(round_length - 1, 0)), inside


def round_mask(attend: Tensor, slots: Tensor, round_start: Tensor, lengths: Tensor) -> Tensor:
    """[B, 1, n, S] bool: each of n new slots sees its row's committed slots and the round slots `attend`
    [B, n, R + n] names (round slot r sits at physical slot round_start + r)."""
    # round slot r -> physical slot round_start + r as a 0/1 matmul, not a gather: inductor's CPU vectoriser emits
    # C++ that does not compile for a gather from a constant-valued `attend` (a chain's), torch 2.11
    offsets = torch.arange(attend.shape[2], device=slots.device)
    place = (slots[None, :] == round_start + offsets[:, None]).to(torch.float32)  # [R + n, S]
    sees_round = (attend.to(torch.float32) @ place) > 0.5  # [B, n, S]
    sees_committed = (slots[None, :] < lengths[:, None])[:, None, :]  # [B, 1, S]
    return (sees_committed | sees_round)[:, None]


def commit_slots(states: list[Tensor], cumulative: list[Tensor], lengths: Tensor, round_start: Tensor,
                 slots: Tensor, counts: Tensor, longest: int) -> None:
    """Move each row's kept round slots (`slots` [B, m], first counts[b] of row b) to the end of its committed
    region in every key/value buffer of `states` ([B, H, S, Dh] each), then update `lengths` [B], the round
    start and each layer's `cumulative` length in place (rows are held at `longest`)."""
    batch, m = slots.shape
    if m and states:
        source = round_start + slots  # [B, m]
        target = (lengths[:, None] + torch.arange(m, device=slots.device)).clamp(max=states[0].shape[2] - 1)
        for buffer in states:
            move_slots_(buffer, source, target)  # in place even when compiled (inplace.py says why)
    # live rows never reach `longest` (the plan reserves their budget); rows that stopped but stay in a
    # compiled batch keep committing their root and are held there, their slots being junk nobody reads
    torch.clamp(lengths + counts, max=longest, out=lengths)
    round_start.copy_(lengths.max() if lengths.numel() else 0)
    for length in cumulative:
        length.copy_(round_start)


def static_cache_length(needed: int, bucket: int = 128) -> int:
    """Round a slot count up to a bucket, so generations of similar length share one compiled shape: a power of
    two (16 at least) below `bucket` slots, so short generations do not attend over empty slots, else a
    multiple of `bucket`."""
    if needed <= bucket:
        return max(16, 1 << (needed - 1).bit_length())
    return -(-needed // bucket) * bucket


def sized_plan(plan: StaticPlan | None, slots: int) -> StaticPlan | None:
    """`plan` with room for `slots` cache slots (bucketed) when it compiles, else None. For targets whose prompt the
    engine does not see (an empty [B, 0] prompt plus conditioning inputs), which size their own static cache."""
    if not compiles(plan):
        return None
    return dataclasses.replace(plan, max_len=static_cache_length(slots))


class StaticRowCache(RowCache):
    """Per-row lengths and an open round over a `Cache` of `StaticLayer`s with `max_len` slots."""

    def __init__(self, batch: int, device: torch.device, num_layers: int, max_len: int, reserve: int = 0,
                 owner: object | None = None, role: str = "model", mode: str | None = None):
        self.cache = Cache(layers=[StaticLayer(max_len) for _ in range(num_layers)])
        self.max_len = max_len
        self.longest = max_len - reserve  # a row's committed length never passes this: one round always fits
        # under CUDA graphs (`mode`) the buffers a round writes are `owner`'s resident ones, kept across generations
        self._resident = (owner, role, mode) if owner is not None and mode is not None else None
        self._settled = self._resident is None  # whether the KV layers are resident (once HF has allocated them)
        self.lengths = self._keep("lengths", torch.zeros(batch, dtype=torch.long, device=device))  # [B] per row
        self.round_start = self._keep("round_start", torch.zeros((), dtype=torch.long, device=device))  # P, []
        self.slots = torch.arange(max_len, device=device)  # [S]
        self._round_positions: list[Tensor] = []
        self._round_attend: Tensor | None = None

    def _keep(self, name: str, value: Tensor) -> Tensor:
        if self._resident is None:
            return value
        owner, role, mode = self._resident
        return resident(owner, f"{role}.{name}", value, mode)

    def _settle(self) -> None:
        """Once HF has allocated the layers (in the eager prefill), move them into the resident buffers."""
        if self._settled or torch.compiler.is_compiling() or not self.allocated:
            return
        for index, layer in enumerate(self.cache.layers):
            layer.keys = self._keep(f"keys.{index}", layer.keys)
            layer.values = self._keep(f"values.{index}", layer.values)
            layer.cumulative_length = self._keep(f"cumulative_length.{index}", layer.cumulative_length)
        self._settled = True

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

    def open_slots(self, positions: Tensor, attend: Tensor) -> Tensor:
        """Register n new round slots; returns the [B, 1, n, S] bool mask for running them. A round's slots start
        at P, where every commit, rollback and row selection left each layer's write position.

        positions: [B, n]; attend: [B, n, R + n] which round slots (earlier ones, then the new) each sees.
        """
        batch, n = positions.shape
        self._settle()
        self._round_positions.append(positions)
        previous = self._round_attend
        self._round_attend = attend if previous is None else torch.cat(
            [torch.cat([previous, attend.new_zeros(batch, previous.shape[1], n)], -1), attend], 1)
        return round_mask(attend, self.slots, self.round_start, self.lengths)

    def slot_positions(self, mask: Tensor) -> tuple[Tensor, Tensor]:
        """(queries [B, n], keys [B, S]): the position of each new slot and of every slot of the cache."""
        batch = mask.shape[0]
        index, inside = round_index(self.slots, self.round_start, self.round_length)
        round_positions = torch.cat(self._round_positions, 1).gather(1, index.expand(batch, -1))  # [B, S]
        return self._round_positions[-1], torch.where(inside, round_positions, self.slots)

    def commit(self, slots: Tensor, counts: Tensor) -> None:
        """Keep round slots `slots[b, :counts[b]]` for row b (in that order); drop the rest of the round."""
        self._settle()
        slots = slots[:, : self.round_length]
        layers = [layer for layer in self.cache.layers if layer.is_initialized]
        commit_slots([t for layer in layers for t in (layer.keys, layer.values)],
                     [layer.cumulative_length for layer in self.cache.layers], self.lengths, self.round_start,
                     slots.contiguous(), counts, self.longest)
        self._round_positions = []
        self._round_attend = None

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
