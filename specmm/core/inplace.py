"""Slot writes into persistent buffers (KV caches, token histories) that stay in place under `torch.compile`.

A compiled round that calls `buffer.scatter_(...)` on a buffer it does not own (a graph input) gets an
out-of-place scatter from functionalization, which inductor cannot write in place: it copies the whole buffer
into a temporary, scatters there, and copies it back, twice the buffer's size per write. For a KV cache that
is every layer's whole cache, every round. `index_put_` is written in place (inductor's reinplacing pass
knows it), and the values are gathered into their own buffer first, so reading and writing one buffer is safe.
Eager mode keeps `scatter_`, which is in place there and needs no index tensors built per call.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _row_head_index(buffer: Tensor, slots: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(rows [B, 1, 1], heads [1, H, 1], slots [B, 1, m]) addressing buffer [B, H, S, D] at slots [B, m]."""
    batch, heads = buffer.shape[:2]
    rows = torch.arange(batch, device=buffer.device)[:, None, None]
    head_index = torch.arange(heads, device=buffer.device)[None, :, None]
    return rows, head_index, slots[:, None, :]


def read_slots(buffer: Tensor, slots: Tensor) -> Tensor:
    """buffer [B, H, S, D] at slots [B, m] -> [B, H, m, D] (a new tensor; reads need no in-place care)."""
    heads, dim = buffer.shape[1], buffer.shape[3]
    return buffer.gather(2, slots[:, None, :, None].expand(-1, heads, -1, dim))


def write_slots_(buffer: Tensor, slots: Tensor, values: Tensor) -> None:
    """buffer[b, :, slots[b, j]] = values[b, :, j] in place; buffer [B, H, S, D], slots [B, m], values [B, H, m, D].

    Duplicate slots in a row keep one of their values (which one is unspecified, as with `scatter_`)."""
    values = values.to(buffer.dtype)
    if torch.compiler.is_compiling():
        buffer.index_put_(_row_head_index(buffer, slots), values)
    else:
        buffer.scatter_(2, slots[:, None, :, None].expand_as(values), values)


def move_slots_(buffer: Tensor, source: Tensor, target: Tensor) -> None:
    """Copy slots source [B, m] to slots target [B, m] of buffer [B, H, S, D] in place (read before written)."""
    write_slots_(buffer, target, read_slots(buffer, source))


def write_columns_(buffer: Tensor, columns: Tensor, values: Tensor) -> None:
    """buffer[b, columns[b, j]] = values[b, j] in place; buffer [B, L], columns and values [B, m]."""
    values = values.to(buffer.dtype)
    if torch.compiler.is_compiling():
        buffer.index_put_((torch.arange(buffer.shape[0], device=buffer.device)[:, None], columns), values)
    else:
        buffer.scatter_(1, columns, values)
