"""Per-row bookkeeping over a stock HF `DynamicCache` whose rows hold different numbers of tokens.

Row b's committed tokens sit left-aligned in slots [0, lengths[b]); slot s holds position s. Slots past a
row's length (up to the physical cache length) are stale and masked out. A *round* appends slots after the
physical length (a draft tree, or a ragged run of new tokens); `commit` gathers each row's kept round
slots to the end of its committed region and drops the rest, so stale slots never pile up: the physical
length is always max(lengths).
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import DynamicCache


class RowCache:
    """A `DynamicCache` plus a committed length per row and the open round's slot positions."""

    def __init__(self, batch: int, device: torch.device):
        self.cache = DynamicCache()  # no config: every layer keeps all its keys; windows are applied by masks
        self.lengths = torch.zeros(batch, dtype=torch.long, device=device)  # [B] committed tokens per row
        self._round_positions: list[Tensor] = []  # [B, n] positions of each block of round slots
        self._round_attend: Tensor | None = None  # [B, R, R] which round slots each round slot sees

    @property
    def physical_length(self) -> int:
        return self.cache.get_seq_length()

    @property
    def round_length(self) -> int:
        return sum(p.shape[1] for p in self._round_positions)

    @property
    def committed_length(self) -> int:
        return self.physical_length - self.round_length

    def open_slots(self, positions: Tensor, attend: Tensor) -> Tensor:
        """Register n new round slots and return the [B, 1, n, S] bool mask for running them.

        positions: [B, n] position id of each new slot.
        attend: [B, n, R + n] which of the round's slots (earlier ones, then the new ones) each new slot sees.
        """
        batch, n = positions.shape
        committed = self.committed_length
        slots = torch.arange(committed, device=positions.device)
        sees_committed = (slots[None, :] < self.lengths[:, None])[:, None, :].expand(batch, n, committed)
        mask = torch.cat([sees_committed, attend], dim=-1)  # [B, n, S]
        self._round_positions.append(positions)
        previous = self._round_attend
        grown = attend if previous is None else torch.cat(
            [torch.cat([previous, attend.new_zeros(batch, previous.shape[1], n)], -1), attend], 1)
        self._round_attend = grown
        return mask[:, None]

    def slot_positions(self, mask: Tensor) -> tuple[Tensor, Tensor]:
        """(queries [B, n], keys [B, S]): the position of each new slot and of every slot of a [B, 1, n, S] mask
        from `open_slots`."""
        batch = mask.shape[0]
        committed = mask.shape[-1] - self.round_length  # the new slots are registered but not yet run
        keys = torch.cat([torch.arange(committed, device=mask.device).expand(batch, committed),
                          *self._round_positions], dim=1)
        return self._round_positions[-1], keys

    def windowed(self, mask: Tensor, window: int) -> Tensor:
        """Restrict a [B, 1, n, S] mask from `open_slots` to keys less than `window` positions back."""
        queries, keys = self.slot_positions(mask)
        return mask & (queries[:, :, None] - keys[:, None, :] < window)[:, None]

    def chunked(self, mask: Tensor, chunk: int) -> Tensor:
        """Restrict a [B, 1, n, S] mask from `open_slots` to keys in the query's block of `chunk` positions (HF's
        chunked attention: position // chunk equal; its left-padding shift is positions starting at 0)."""
        queries, keys = self.slot_positions(mask)
        return mask & (queries[:, :, None] // chunk == keys[:, None, :] // chunk)[:, None]

    def round_attend(self, parent_slots: Tensor) -> Tensor:
        """[B, n] parent round slot (-1 = none) -> [B, n, R + n] attend rows: the parent's view plus self."""
        batch, n = parent_slots.shape
        r = self.round_length
        rows = torch.zeros(batch, n, r + n, dtype=torch.bool, device=parent_slots.device)
        if r:
            parent_view = self._round_attend.gather(
                1, parent_slots.clamp_min(0)[:, :, None].expand(batch, n, r))  # [B, n, R]
            rows[:, :, :r] = parent_view & (parent_slots >= 0)[:, :, None]
        rows[:, :, r:] = torch.eye(n, dtype=torch.bool, device=parent_slots.device)
        return rows

    def commit(self, slots: Tensor, counts: Tensor) -> None:
        """Keep round slots `slots[b, :counts[b]]` (in that order) for row b, drop the rest of the round.

        slots: [B, m] round slot indices; counts: [B] how many of them each row keeps.
        """
        slots = slots[:, : self.round_length]  # a row can keep at most the round's slots
        batch, m = slots.shape
        committed = self.committed_length
        if m:
            source = committed + slots  # [B, m] physical slots to read
            target = self.lengths[:, None] + torch.arange(m, device=slots.device)  # [B, m] where they go
            for layer in self.cache.layers:
                for name in ("keys", "values"):
                    states = getattr(layer, name)  # [B, H, S, Dh]
                    heads, dim = states.shape[1], states.shape[3]
                    src = source[:, None, :, None].expand(batch, heads, m, dim)
                    dst = target[:, None, :, None].expand(batch, heads, m, dim)
                    states.scatter_(2, dst, states.gather(2, src))
        self.lengths = self.lengths + counts
        self._fit()

    def rollback(self) -> None:
        """Drop every round slot."""
        self._truncate(self.committed_length)

    def rewind(self, counts: Tensor) -> None:
        """Forget the last counts[b] committed tokens of row b (no round may be open). counts: [B]."""
        self.lengths = self.lengths - counts
        self._fit()

    def take_rows(self, rows: Tensor) -> RowCache:
        """A new RowCache holding a copy of `rows` [b] (in that order); this one is left as it is.

        Lets a caller run a sub-batch (e.g. the rows of a batch that take a different path this step) and
        `put_rows` it back, instead of running every row with masks. No round may be open.
        """
        part = RowCache(0, self.lengths.device)
        for index, layer in enumerate(self.cache.layers):
            if getattr(layer, "keys", None) is not None:
                part.cache.update(layer.keys[rows], layer.values[rows], index)
        part.lengths = self.lengths[rows]
        part._fit()
        return part

    def put_rows(self, rows: Tensor, part: RowCache) -> None:
        """Overwrite `rows` [b] with the rows of `part` (from `take_rows`, possibly grown since). No round may
        be open in either cache."""
        for index, layer in enumerate(part.cache.layers):
            if getattr(layer, "keys", None) is None:
                continue
            if index >= len(self.cache.layers) or getattr(self.cache.layers[index], "keys", None) is None:
                shape = (self.lengths.shape[0], *layer.keys.shape[1:2], 0, layer.keys.shape[3])
                self.cache.update(layer.keys.new_zeros(shape), layer.values.new_zeros(shape), index)
            own = self.cache.layers[index]
            grow = layer.keys.shape[2] - own.keys.shape[2]  # the part may hold more slots than this cache
            if grow > 0:
                own.keys = torch.nn.functional.pad(own.keys, (0, 0, 0, grow))
                own.values = torch.nn.functional.pad(own.values, (0, 0, 0, grow))
            width = layer.keys.shape[2]
            own.keys[rows, :, :width] = layer.keys
            own.values[rows, :, :width] = layer.values
        self.lengths = self.lengths.clone()
        self.lengths[rows] = part.lengths
        self._fit()

    def select_rows(self, rows: Tensor) -> None:
        """Keep only `rows` of the batch (between rounds)."""
        self.cache.batch_select_indices(rows)
        for layer in self.cache.layers:  # HF skips empty layers, which would keep the old batch size
            if getattr(layer, "keys", None) is not None and layer.keys.shape[-2] == 0:
                layer.keys, layer.values = layer.keys[rows], layer.values[rows]
        self.lengths = self.lengths[rows]
        self._fit()

    def _fit(self) -> None:
        """Read as many slots per row as the longest committed row holds (0 for no rows); closes any round."""
        self._truncate(int(self.lengths.max()) if self.lengths.numel() else 0)

    def _truncate(self, length: int) -> None:
        excess = self.physical_length - length
        if excess > 0:
            self.cache.crop(-excess)
        self._round_positions = []
        self._round_attend = None
