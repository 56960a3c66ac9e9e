"""Compiled mode: which forwards run through `torch.compile`, compiled once per model and reused.

`StaticPlan` is what the engine hands every target and drafter that supports the fast path: how many
cache slots to preallocate and whether to compile. `CompiledForward` runs a model's forward compiled (static
shapes, one graph per shape, shared by every runner of that model across `generate` calls); if compilation
fails it warns once, naming the model and the reason, and runs eager from then on. Compile time is measured
on the host and reported apart, never inside a timed row.
"""

from __future__ import annotations

import logging
import os
import time
import warnings
import weakref
from dataclasses import dataclass

import torch
from torch import nn

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StaticPlan:
    """Fast-path settings of one generation: static caches of `max_len` slots, compiled forwards or not."""

    max_len: int
    reserve: int = 0  # slots kept free past every row for one round (tree, pending tokens): rows stop short of it
    compile: bool = True
    mode: str | None = None  # torch.compile mode: None on CPU, "reduce-overhead" (CUDA graphs) on CUDA


BACKEND = os.environ.get("SPECMM_COMPILE_BACKEND", "inductor")
"""torch.compile backend of compiled mode: inductor (the fast path). "aot_eager" checks graph capture without
generating kernels, which the test suite uses where codegen time would dominate."""


class CompileClock:
    """Seconds spent compiling (first calls of each new shape), summed for the stats."""

    seconds = 0.0


_COMPILED: weakref.WeakKeyDictionary[nn.Module, CompiledForward] = weakref.WeakKeyDictionary()


def compiled_forward(model: nn.Module, mode: str | None = None) -> CompiledForward:
    """The one compiled forward of `model` (made on first use)."""
    found = _COMPILED.get(model)
    if found is None or found.mode != mode or found.backend != BACKEND:
        found = _COMPILED[model] = CompiledForward(model, mode, BACKEND)
    return found


def compile_failure(model: nn.Module) -> str | None:
    """Why compiled mode could not compile `model` (None when it compiled, or was never asked to)."""
    found = _COMPILED.get(model)
    return None if found is None else found.failed


class CompiledForward:
    """`model(**inputs)` through `torch.compile(dynamic=False)`; eager, with one warning, if it cannot compile."""

    def __init__(self, model: nn.Module, mode: str | None = None, backend: str = "inductor"):
        self.model, self.mode, self.backend = model, mode, backend
        # every HF forward shares one wrapper code object, so its graphs (one per model and shape) share dynamo's
        # per-code recompile limit: raise it, or the target's and drafters' shapes would soon fall back to eager
        limit = max(torch._dynamo.config.recompile_limit, 64)
        torch._dynamo.config.recompile_limit = limit
        torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit, 4 * limit)
        self.compiled = torch.compile(model.forward, dynamic=False, mode=mode if backend == "inductor" else None,
                                      backend=backend)
        self.failed: str | None = None  # why compilation failed, once it has
        self.shapes: set[tuple] = set()

    def __call__(self, **inputs):
        if self.failed is not None:
            return self.model(**inputs)
        inputs = {k: v.contiguous() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
        key = tuple((k, tuple(v.shape), v.dtype) for k, v in sorted(inputs.items()) if isinstance(v, torch.Tensor))
        first = key not in self.shapes
        started = time.perf_counter()
        try:
            out = self.compiled(**inputs)
        except torch._dynamo.exc.TorchDynamoException as error:  # compilation, not the model, failed
            self.failed = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            warnings.warn(f"compile=True: {type(self.model).__name__} could not be compiled ({self.failed}); "
                          "running it eager", RuntimeWarning, stacklevel=3)
            return self.model(**inputs)
        if first:
            self.shapes.add(key)
            CompileClock.seconds += time.perf_counter() - started
        return out
