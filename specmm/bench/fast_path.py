"""Compiled rows of a benchmark: HF's own static-cache + `torch.compile` decoding, and which parts of a compiled
specmm generator really ran compiled.

HF baseline. transformers 5.x compiles `generate`'s decoding steps by itself when the cache is static and
`_valid_auto_compile_criteria` holds: on CUDA that is automatic, elsewhere it needs a `CompileConfig` with
`_compile_all_devices`. The prefill stays eager; the decode step is `torch.compile(model.__call__)` stored on the
model as `_compiled_call`. That is the fastest plain decoding a user of stock HF models gets, so it is the
baseline compiled specmm rows must beat. `hf_compile_scope` removes what HF left on the model afterwards (the
compiled call, its config, the static cache length it keeps growing to avoid recompiles).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

from torch import nn



MODES = ("eager", "compiled")


@dataclass
class FastPathSetup:
    """What every bench setup with a fast path shares: the specmm modes it runs, the HF compiled baseline, and
    the profiled run for the per-round time split."""

    modes: tuple[str, ...] = ("eager",)  # specmm modes to run: "eager" and/or "compiled"
    hf_static: bool | None = None  # the HF static-cache + compiled AR baseline (None: when "compiled" is in modes)
    profile: bool = True  # one extra untimed profiled run per speculative row, for the per-round time split

    def __post_init__(self):
        unknown = [m for m in self.modes if m not in MODES]
        if unknown or not self.modes:
            raise ValueError(f"modes: expected some of {MODES}, got {self.modes!r}")
        if self.hf_static is None:
            self.hf_static = "compiled" in self.modes

def hf_static_compile_kwargs(model: nn.Module) -> dict:
    """`generate` kwargs for HF's static cache with the decode step compiled (static shapes).

    The same `CompileConfig` object serves every call on `model` (HF recompiles when the config changes). Mode
    `reduce-overhead` (CUDA graphs, HF's default) on CUDA, as specmm's compiled mode uses; inductor's default on
    other devices, where HF would not compile without `_compile_all_devices`, with the same inductor options as
    specmm's rows (`compiled.inductor_options`: the C++ wrapper on a CPU machine). The backend is specmm's compiled
    mode's (`specmm.core.compiled.BACKEND`: inductor unless a test asks for `aot_eager`).
    """
    config = getattr(model, "_specmm_bench_compile_config", None)
    if config is None:
        from transformers import CompileConfig

        from specmm.core import compiled

        cuda = next(model.parameters()).device.type == "cuda"
        options = compiled.inductor_options(None) if compiled.BACKEND == "inductor" and not cuda else {}
        # torch.compile takes a mode or options, not both; no mode is inductor's default
        config = CompileConfig(fullgraph=False, dynamic=False, backend=compiled.BACKEND,
                               mode="reduce-overhead" if cuda else None, options=options or None)
        config._compile_all_devices = True  # HF compiles only on accelerators unless told
        model._specmm_bench_compile_config = config
    return {"cache_implementation": "static", "compile_config": config}


@contextmanager
def hf_compile_scope(model: nn.Module):
    """Leave `model` as it was: its `forward`, and none of the compiled call HF's static `generate` stores on it."""
    forward = model.__dict__.get("forward")
    added = [name for name in ("_compiled_call", "_last_compile_config", "_previous_max_cache_length",
                               "_specmm_bench_compile_config") if name not in model.__dict__]
    try:
        yield model
    finally:
        for name in added:
            model.__dict__.pop(name, None)
        if forward is None:
            model.__dict__.pop("forward", None)
        else:
            model.forward = forward


def hf_compiled(model: nn.Module) -> bool:
    """Whether HF `generate` compiled `model`'s decode step (it keeps the compiled call on the model)."""
    return "_compiled_call" in model.__dict__


def compiled_parts(gen) -> list[str]:
    """The parts of `gen` ("target", "drafter") that ran compiled in its last generation: the fast mode on, the part
    has a fast path (`static_plan`), and the rounds ran as one graph (else the generation ran eagerly)."""
    if not getattr(gen, "compile", False) or getattr(gen, "whole_round", None) is False:
        return []
    return [role for role, part in (("target", gen.target), ("drafter", gen.drafter)) if hasattr(part, "static_plan")]


def eager_drafter(drafter):
    """`drafter` for an eager generator (the engine also resets `static_plan` at every `begin`; kept so a
    drafter handed to code outside the engine is eager too)."""
    if getattr(drafter, "static_plan", None) is not None:
        drafter.static_plan = None
    return drafter


def describe_parts(parts: list[str]) -> str:
    return "+".join(parts) if parts else "none"


__all__ = ["compiled_parts", "describe_parts", "eager_drafter", "hf_compile_scope", "hf_compiled",
           "hf_static_compile_kwargs"]
