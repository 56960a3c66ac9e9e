"""The fast mode of the image sampler (`ImageSampler(compile=True)`).

Each pure tensor part of a round is an `nn.Module` (the guided verify and the cache commit in `target`, the
Jacobi draft in `jacobi`, the drafter round in `drafter`), kept once per model (`part`). The engine calls them in
its rounds, eagerly or traced into the round's one graph; plain decoding's step (`DecodeStep`) runs through
`run`, compiled on its own (`specmm.core.compiled.compiled_forward`). Random draws are made before a part runs, in
eager mode's order, so both modes give the same tokens, and nothing in a part reads a tensor on the host.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import Tensor, nn

from specmm.core.compiled import StaticPlan, compile_failure, compiled_forward, graph_mode
from specmm.core.compiled_accept import AcceptWalk
from specmm.image_ar.llamagen.gpt import KVCache


def image_plan(device: torch.device) -> StaticPlan:
    """The plan of an image generation: LlamaGen's own static caches, compiled parts (CUDA graphs on CUDA)."""
    return StaticPlan(max_len=0, compile=True, mode=graph_mode(device))


def part(owner: nn.Module, kind: type[nn.Module], *args) -> nn.Module:
    """The one `kind(owner, *args)` module of `owner`, kept on it so every sampler of the model shares its graphs."""
    parts = getattr(owner, "_specmm_image_parts", None)  # a plain dict, not a submodule: no state_dict change
    if parts is None:
        parts = {}
        object.__setattr__(owner, "_specmm_image_parts", parts)
    if kind not in parts:
        parts[kind] = kind(owner, *args)
    return parts[kind]


def run(module: nn.Module, plan: StaticPlan | None, **inputs):
    """`module(**inputs)`, through its compiled forward when `plan` compiles."""
    if plan is None or not plan.compile:
        return module(**inputs)
    return compiled_forward(module, plan.mode)(**inputs)


def kept_cache(owner: nn.Module, name: str, shape: tuple, make: Callable[[], KVCache],
               plan: StaticPlan | None) -> KVCache:
    """`make()`; in compiled mode the one cache of `owner` (a model) for `name` and `shape` (rows, length, dtype,
    device), its buffers static. Every generation and sampler of that shape writes the same buffers (stale slots are
    masked, never cleared), so CUDA graphs recorded over them replay rather than record again (the trees stop
    graphing a function recorded 128 times). Each caller gets its own `KVCache` object over them: narrowing it
    (`select_rows`) rebinds only the caller's lists."""
    if plan is None or not plan.compile:
        return make()
    caches = owner.__dict__.setdefault("_specmm_image_caches", {})  # a plain dict, not a submodule
    cache = caches.get((name, *shape))
    if cache is None:
        cache = caches[(name, *shape)] = make()
        static_buffers(cache.keys + cache.values, plan)
    return copy.copy(cache)


def static_buffers(tensors: list[Tensor], plan: StaticPlan | None) -> None:
    """Mark cache buffers a compiled part writes in place as static (CUDA graphs keep their addresses)."""
    if plan is not None and plan.compile and plan.mode is not None:
        for tensor in tensors:
            torch._dynamo.mark_static_address(tensor)


def compile_failures(*owners: nn.Module | None) -> list[str]:
    """Why compiled parts of `owners` (a GPT, a drafter head) could not compile ([] when all did)."""
    parts = [p for o in owners if o is not None for p in o.__dict__.get("_specmm_image_parts", {}).values()]
    reasons = [(type(p).__name__, compile_failure(p)) for p in parts]
    return [f"{name}: {why}" for name, why in reasons if why is not None]


__all__ = ["AcceptWalk", "compile_failures", "image_plan", "kept_cache", "part", "run", "static_buffers"]
