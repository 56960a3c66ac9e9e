"""Which batches a (resumed) job still runs.

A job's batches are fixed slices of its item list, whatever is already done: a resumed job re-runs a slice that
holds any missing item (writing only the missing ones) rather than packing the leftovers into new batches. So
results that depend on a batch's composition (a generator per batch, a policy's random stream, padding
numerics) come out exactly as in an uninterrupted run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

Item = TypeVar("Item")


def pending_batches(items: Sequence[Item], batch_size: int, is_done: Callable[[Item], bool]) -> list[list[Item]]:
    """The slices `items[i : i + batch_size]` (i = 0, batch_size, ...) holding an item for which `is_done` is false."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size: expected an integer >= 1, got {batch_size!r}")
    slices = [list(items[i: i + batch_size]) for i in range(0, len(items), batch_size)]
    return [s for s in slices if not all(is_done(item) for item in s)]


__all__ = ["pending_batches"]
