"""A graphed round's state: tensors the round binds into its state are copied out of the CUDA graph's pool.

A compiled round writes most of its state in place, into resident buffers (`specmm.core.resident`). What it
rebinds instead (`self.pending = ...` in a drafter, a cache's `lengths`, a runner's captured features) is, under
CUDA graphs, an output buffer of the graph, which the next replay overwrites while the state still reads it
(the first GPU run's "accessing tensor output of CUDAGraphs that has been overwritten by a subsequent run").
`StateSnapshot` remembers the tensors a round's state holds before the round; `own_rebound` then replaces each
tensor the round bound into it with a copy, so any state object, a user's drafter too, survives graph replays.
"""

from __future__ import annotations

from torch import Tensor, nn

MAX_DEPTH = 8  # attribute levels below the round's arguments that are searched


class StateSnapshot:
    """The tensors reachable from `roots` (attributes, dicts, lists, tuples; not inside modules, whose parameters
    and buffers never move), held so that their ids stay theirs until the round is over."""

    def __init__(self, roots: list[object]):
        self.tensors: list[Tensor] = []
        seen: set[int] = set()
        stack = [(root, 0) for root in roots]
        while stack:
            value, depth = stack.pop()
            if isinstance(value, Tensor):
                self.tensors.append(value)
            elif depth <= MAX_DEPTH and id(value) not in seen and not isinstance(value, (nn.Module, type)):
                seen.add(id(value))
                stack += [(item, depth + 1) for item in _items(value)]
        self.ids = {id(t) for t in self.tensors}


def own_rebound(roots: list[object], before: StateSnapshot) -> None:
    """Replace every tensor reachable from `roots` that `before` did not hold with a copy of it (lists, dicts and
    objects in place, tuples and named tuples rebuilt in their holder)."""
    done: dict[int, object] = {}  # id -> its owned version (one copy of a tensor or tuple held in several places)

    def owned(value, depth: int):
        if id(value) in done:
            return done[id(value)]
        if isinstance(value, Tensor):
            done[id(value)] = value if id(value) in before.ids else value.clone()
            return done[id(value)]
        if depth > MAX_DEPTH or isinstance(value, (nn.Module, type)):
            return value
        done[id(value)] = value  # containers in place; a tuple's own entry is replaced below
        if isinstance(value, tuple):
            items = [owned(item, depth + 1) for item in value]
            if not all(new is old for new, old in zip(items, value)):
                done[id(value)] = type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
            return done[id(value)]
        if isinstance(value, (list, dict)):
            keys = range(len(value)) if isinstance(value, list) else list(value)
            for key in keys:
                new = owned(value[key], depth + 1)
                if new is not value[key]:
                    value[key] = new
        elif hasattr(value, "__dict__"):
            for key, item in list(vars(value).items()):
                new = owned(item, depth + 1)
                if new is not item:
                    object.__setattr__(value, key, new)  # a frozen dataclass too
        return value

    for root in roots:
        owned(root, 0)


def _items(value) -> list:
    if isinstance(value, dict):
        return list(value.values())
    if isinstance(value, (list, tuple)):
        return list(value)
    return list(vars(value).values()) if hasattr(value, "__dict__") else []


__all__ = ["StateSnapshot", "own_rebound"]
