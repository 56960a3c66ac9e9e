"""Buffers that keep their address from one generation to the next, so CUDA graphs recorded over them replay.

CUDA-graph trees let a graph write in place only into static addresses, and record the graph again whenever such
an address changes. A compiled round writes its state (output tokens, counters, row lengths, the KV cache) in
place, and a generation allocates that state afresh, so under CUDA graphs each buffer is kept per owner (the model
it serves), name, shape and dtype, overwritten with the new generation's initial value, and marked static. Other
modes keep the fresh tensors: nothing is recorded there, and tests compare them.
"""

from __future__ import annotations

import weakref

import torch
from torch import Tensor

from specmm.core.compiled import GRAPHED, held_modules

_RESIDENT: weakref.WeakKeyDictionary[object, dict[tuple, Tensor]] = weakref.WeakKeyDictionary()


def resident(owner: object, name: str, value: Tensor, mode: str | None) -> Tensor:
    """`value`; under CUDA graphs (`mode` GRAPHED) the one buffer of `owner` (weak-referenced, e.g. a model) for this
    name, shape, dtype and device, holding a copy of `value` and marked a static address."""
    if mode != GRAPHED:
        return value
    buffers = _RESIDENT.setdefault(owner, {})
    key = (name, tuple(value.shape), value.dtype, value.device)
    buffer = buffers.get(key)
    if buffer is None:
        buffer = buffers[key] = value.clone()
        torch._dynamo.mark_static_address(buffer)  # unguarded: a new address re-records, it does not recompile
    elif buffer is not value:
        buffer.copy_(value)
    return buffer


def owner_of(part: object) -> object:
    """The object a part's resident buffers belong to: the first model it holds (generators and drafters come and go
    over the same model, and share its graphs), else its class (a model-free drafter such as prompt lookup)."""
    modules = held_modules(part)
    return modules[0] if modules else type(part)


__all__ = ["owner_of", "resident"]
