"""`SlotRowCache`: the `RowCache` bookkeeping over per-row key/value buffers that sub-batches share, not copy.

Every layer keeps one buffer [B, H, capacity, Dh] for the whole batch (a `SlotStore`); row b's slots
[0, lengths[b]) are committed and the rest are stale, masked as in `RowCache`. `take_rows(rows)` returns a
*view*: the same buffers, the rows' indices and their lengths. A forward on a view writes its new slots straight
into those rows and `put_rows` copies back only the lengths, so a scheduler that runs a different subset of rows
at every step (`specmm.reasoning.schedule`) never copies caches out and back in. A forward reads its rows' keys
as one tensor [b, H, S, Dh], as HF attention expects: a view of the buffer for the whole batch, a gathered copy
for a subset.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers.cache_utils import Cache, CacheLayerMixin

from specmm.core.cache import RowCache


class SlotStore:
    """One attention layer's keys and values for every row of a batch: [B, H, capacity, Dh] each, grown by
    doubling (None until the first write tells heads, head size and dtype)."""

    def __init__(self, batch: int):
        self.batch = batch
        self.keys: Tensor | None = None
        self.values: Tensor | None = None

    def reserve(self, slots: int, keys: Tensor, values: Tensor) -> None:
        """Make room for `slots` slots per row, shaped like new states `keys`/`values` [b, H, n, Dh]."""
        capacity = 0 if self.keys is None else self.keys.shape[2]
        if slots <= capacity:
            return
        size = max(slots, 2 * capacity, 16)
        grown = []
        for old, like in ((self.keys, keys), (self.values, values)):
            new = like.new_zeros(self.batch, like.shape[1], size, like.shape[3])
            if old is not None:
                new[:, :, :capacity] = old
            grown.append(new)
        self.keys, self.values = grown


class SlotLayer(CacheLayerMixin):
    """HF's view of one layer: rows `rows` [b] of a `SlotStore` (None: every row, in order), `length` slots each."""

    is_compileable = False
    is_sliding = False

    def __init__(self, store: SlotStore, rows: Tensor | None, length: int):
        super().__init__()
        self.store, self.rows, self.length = store, rows, length
        self.is_initialized = True

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        self.store.reserve(self.length + key_states.shape[2], key_states, value_states)

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        """Write new states [b, H, n, Dh] at slots [length, length + n) of this view's rows; return [b, H, S, Dh]."""
        end = self.length + key_states.shape[2]
        store = self.store
        store.reserve(end, key_states, value_states)
        rows = slice(None) if self.rows is None else self.rows
        store.keys[rows, :, self.length:end] = key_states
        store.values[rows, :, self.length:end] = value_states
        self.length = end
        return self.states()

    def states(self) -> tuple[Tensor, Tensor]:
        """This view's keys and values [b, H, length, Dh] (a copy for a subset of rows)."""
        keys, values = self.store.keys[:, :, :self.length], self.store.values[:, :, :self.length]
        if self.rows is None:
            return keys, values
        return keys.index_select(0, self.rows), values.index_select(0, self.rows)

    def move(self, source: Tensor, target: Tensor) -> None:
        """Copy slot source[i, j] of this view's row i to slot target[i, j] ([b, m] each), in every buffer."""
        rows = self.rows if self.rows is not None else torch.arange(source.shape[0], device=source.device)
        for buffer in (self.store.keys, self.store.values):
            buffer[rows[:, None], :, target] = buffer[rows[:, None], :, source]  # the read is a copy: no overlap

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return -1


class _SlotCache(Cache):
    """The `Cache` HF models see: a `SlotLayer` per attention layer, made as layers first write."""

    def __init__(self, owner: SlotRowCache):
        super().__init__(layers=[])
        self.owner = owner

    def update(self, key_states: Tensor, value_states: Tensor, layer_idx: int, *args, **kwargs):
        return self.owner.layer(layer_idx).update(key_states, value_states)


class SlotRowCache(RowCache):
    """Per-row lengths and an open round, as `RowCache`, over `SlotStore`s that `take_rows` views share."""

    def __init__(self, batch: int, device: torch.device, stores: list[SlotStore] | None = None,
                 rows: Tensor | None = None, store_batch: int | None = None):
        self.stores = stores if stores is not None else []  # one per attention layer, shared with every view
        self.rows = rows  # [b] this view's rows in the stores (None: all of them, in order)
        self.store_batch = batch if store_batch is None else store_batch  # rows of the stores
        self.lengths = torch.zeros(batch, dtype=torch.long, device=device)  # [B] committed tokens per row
        self._length = 0  # slots per row that forwards read (max(lengths) plus the open round)
        self.cache = _SlotCache(self)
        self.cache.layers = [SlotLayer(store, rows, 0) for store in self.stores]
        self._round_positions: list[Tensor] = []
        self._round_attend: Tensor | None = None

    def layer(self, index: int) -> SlotLayer:
        """This cache's view of attention layer `index`, made (with its store, when no cache of these buffers has
        reached that layer yet) on first use."""
        while len(self.stores) <= index:
            self.stores.append(SlotStore(self.store_batch))
        layers = self.cache.layers
        while len(layers) <= index:
            layers.append(SlotLayer(self.stores[len(layers)], self.rows, self._length))
        return layers[index]

    @property
    def physical_length(self) -> int:
        return self.cache.layers[0].length if self.cache.layers else self._length

    def commit(self, slots: Tensor, counts: Tensor) -> None:
        """Keep round slots `slots[b, :counts[b]]` for row b, moved to the end of its committed region."""
        slots = slots[:, : self.round_length]
        m = slots.shape[1]
        if m:
            source = self.committed_length + slots  # [B, m]
            target = self.lengths[:, None] + torch.arange(m, device=slots.device)  # [B, m]
            for layer in self.cache.layers:
                layer.move(source, target)
        self.lengths = self.lengths + counts
        self._fit()

    def take_rows(self, rows: Tensor) -> SlotRowCache:
        """A view of `rows` [b]: the same buffers (nothing copied), those rows' lengths. No round may be open."""
        in_store = rows if self.rows is None else self.rows[rows]
        part = SlotRowCache(rows.shape[0], self.lengths.device, self.stores, in_store, self.store_batch)
        part.lengths = self.lengths[rows]
        part._fit()
        return part

    def put_rows(self, rows: Tensor, part: RowCache) -> None:
        """Take `part`'s rows back over `rows` [b]: only their lengths when `part` is a view of these buffers,
        else their states are copied in. No round may be open in either cache."""
        if not (isinstance(part, SlotRowCache) and part.stores is self.stores):
            self._copy_in(rows, part)
        self.lengths = self.lengths.clone()
        self.lengths[rows] = part.lengths
        self._fit()

    def _copy_in(self, rows: Tensor, part: RowCache) -> None:
        """Write the committed slots of another cache's rows over `rows` [b] of these buffers."""
        in_store = rows if self.rows is None else self.rows[rows]
        for index, layer in enumerate(part.cache.layers):
            keys, values = layer.states() if isinstance(layer, SlotLayer) else (layer.keys, layer.values)
            if keys is None or keys.numel() == 0:
                continue
            store, width = self.layer(index).store, keys.shape[2]
            store.reserve(width, keys, values)
            store.keys[in_store, :, :width], store.values[in_store, :, :width] = keys, values

    def select_rows(self, rows: Tensor) -> None:
        """Keep only `rows` of the batch (between rounds): only the row indices change, the buffers stay."""
        every = torch.arange(self.store_batch, device=rows.device)
        self.rows = (every if self.rows is None else self.rows)[rows]
        for layer in self.cache.layers:
            layer.rows = self.rows
        self.lengths = self.lengths[rows]
        self._fit()

    def _truncate(self, length: int) -> None:
        self._length = length
        for layer in self.cache.layers:
            layer.length = length
        self._round_positions = []
        self._round_attend = None
