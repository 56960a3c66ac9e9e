"""The fast mode's two tiers: a generation runs eagerly, or each round after its warm-up runs as one compiled graph.

`StaticPlan` is what the engine hands every target and drafter that has a fast path: how many cache slots to
preallocate and whether to compile. `CompiledRound` is a whole round (draft, verify, accept, commit, record) as
one `torch.compile(fullgraph=True)` graph per shape, shared by every generator over the same models; a round that
cannot trace as one graph warns once, naming the reason, and runs eagerly. Nothing is compiled part by part inside
a round. `CompiledForward` compiles a model's forward for loops outside the engine's rounds. Compile time is
measured on the host and reported apart, never inside a timed row.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import time
import types
import warnings
import weakref
from dataclasses import dataclass

import torch
from torch import nn

from specmm.core.draws import DrawTape
from specmm.core.graph_state import StateSnapshot, own_rebound

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StaticPlan:
    """Fast-path settings of one generation: static caches of `max_len` slots, compiled forwards or not."""

    max_len: int
    reserve: int = 0  # slots kept free past every row for one round (tree, pending tokens): rows stop short of it
    compile: bool = True
    mode: str | None = None  # torch.compile mode: None on CPU, "reduce-overhead" (CUDA graphs) on CUDA
    round_tokens: int = 1  # tokens a drafter may feed at a round's start (the tree's depth + 1): start pads to it


GRAPHED = "reduce-overhead"
"""The torch.compile mode that replays CUDA graphs (`StaticPlan.mode` on CUDA)."""


def graph_mode(device: torch.device | str) -> str | None:
    """The compile mode of compiled mode on `device`: CUDA graphs on CUDA, inductor's default elsewhere."""
    return GRAPHED if torch.device(device).type == "cuda" else None


def run_graphed(compiled, mode: str | None, *args, **kwargs):
    """`compiled(*args, **kwargs)`; under CUDA graphs (`mode` "reduce-overhead") as a step of its own whose outputs are
    copied out of the graph's memory pool.

    CUDA-graph trees give a graph's outputs static buffers, overwritten by the next replay. specmm keeps outputs
    across calls (a verify's logits through the draft steps, a round's state into the next round), which the trees
    refuse ("accessing tensor output of CUDAGraphs that has been overwritten"); one copy per output tensor is the
    price of holding them. Other modes call straight through.
    """
    if mode != GRAPHED:
        return compiled(*args, **kwargs)
    torch.compiler.cudagraph_mark_step_begin()
    return owned_outputs(compiled(*args, **kwargs))


def owned_outputs(value):
    """`value` with every tensor it holds (in tuples, lists, dicts, model outputs, dataclasses) cloned; any other
    object (a cache, whose buffers the graph updates in place) is kept as it is."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):  # a ModelOutput too: its items are its fields
        out = copy.copy(value)
        for key in list(out.keys()):
            out[key] = owned_outputs(out[key])
        return out
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
        return type(value)(*map(owned_outputs, value))
    if isinstance(value, (tuple, list)):
        return type(value)(map(owned_outputs, value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = copy.copy(value)
        for field in dataclasses.fields(value):
            object.__setattr__(out, field.name, owned_outputs(getattr(value, field.name)))
        return out
    return value


def reset_graphs() -> None:
    """Forget every compiled graph and recorded CUDA graph. An exception inside a graphed call leaves the trees'
    bookkeeping half updated, and each later graphed call in the process then fails; a benchmark calls this after a
    failed row. Dynamo's caches go too (`torch._dynamo.reset`, which resets the trees): a compiled function kept
    from before a bare tree reset asserts "Running CUDAGraph after shutdown" (the first GPU run's HF static row),
    so every compiled function traces again (inductor's on-disk cache makes that faster than the first time)."""
    if torch.cuda.is_available():
        torch._dynamo.reset()


def compiles(plan: StaticPlan | None) -> bool:
    """Whether the engine's `plan` (None in eager mode) runs the rounds compiled."""
    return plan is not None and plan.compile


BACKEND = os.environ.get("SPECMM_COMPILE_BACKEND", "inductor")
"""torch.compile backend of compiled mode: inductor (the fast path). "aot_eager" checks graph capture without
generating kernels, which the test suite uses where codegen time would dominate."""


CPP_WRAPPER = os.environ.get("SPECMM_CPP_WRAPPER", "1") != "0"
"""Whether inductor's graphs off CUDA graphs use its C++ wrapper (`cpp_wrapper`) on a machine without CUDA.

A compiled call's Python wrapper costs a few microseconds per kernel; a round of a small model is a few hundred
kernels, so on a CPU the wrapper is a large part of a round (LANTERN on the zoo imagegen, batch 1: 1.11x -> 1.38x
over compiled AR, which gains too; `benchmarks/image_ar-imagegen-cpu-cpu-compiled-chain6-cppwrapper.md`).
Compiling the C++ wrapper costs seconds per graph, reported with the compile time.
The test suite turns it off (SPECMM_CPP_WRAPPER=0) but for the tests that check it."""


def inductor_options(mode: str | None) -> dict:
    """Inductor options of compiled mode for torch.compile `mode` (None off CUDA graphs): `cpp_wrapper` on a
    machine without CUDA when `CPP_WRAPPER` (a GPU machine keeps the Python wrapper: untested there)."""
    if mode is None and CPP_WRAPPER and not torch.cuda.is_available():
        return {"cpp_wrapper": True}
    return {}


class CompileClock:
    """Seconds spent compiling (first calls of each new shape), summed for the stats."""

    seconds = 0.0


_COMPILED: weakref.WeakKeyDictionary[nn.Module, dict[tuple, CompiledForward]] = weakref.WeakKeyDictionary()


def compiled_forward(model: nn.Module, mode: str | None = None) -> CompiledForward:
    """The one compiled forward of `model` for `mode` (made on first use), for a loop outside the engine's rounds."""
    if torch.compiler.is_compiling():  # inside a compiled graph: the model is traced into it (no registry
        return model  # lookup: a guard on the registry would recompile the graph whenever it grows)
    kept = _COMPILED.setdefault(model, {})
    key = (mode, BACKEND)
    found = kept.get(key)
    if found is None:
        found = kept[key] = CompiledForward(model, mode, BACKEND)
    return found


def compile_failure(model: nn.Module) -> str | None:
    """Why compiled mode could not compile `model` (None when it compiled, or was never asked to)."""
    return next((found.failed for found in _COMPILED.get(model, {}).values() if found.failed is not None), None)


def compile_static(fn, mode: str | None = None, backend: str | None = None, fullgraph: bool = False):
    """`torch.compile(fn, dynamic=False)` with the fast mode's settings, under a code object of its own.

    Dynamo keeps its graphs and guards per code object. A fresh copy of `fn`'s code per call site keeps the
    target's, each drafter's and each helper's graphs apart: a call checks the guards of its own few graphs,
    not of every graph made from the same source. A graph traced whole (`fullgraph`) skips the guards on
    nn-module attributes (`module_guard_filter`): the fast mode assumes a model's module attributes are not
    changed between calls. A graph that may break keeps them: its resume functions are shared by every
    instance of a class, and those guards tell one layer's graph from another's.
    """
    backend = backend or BACKEND
    own = _own_code(fn)
    options = {"guard_filter_fn": module_guard_filter} if fullgraph else {}
    if backend == "inductor" and mode is not None:
        from torch._inductor import list_mode_options

        options.update(list_mode_options(mode))
    if backend == "inductor":
        options.update(inductor_options(mode))
    return torch.compile(own, dynamic=False, backend=backend, options=options, fullgraph=fullgraph)


_KEPT_MODULE_GUARDS = ("EMPTY_NN_MODULE_HOOKS_DICT", "TENSOR_MATCH")


def module_guard_filter(entries) -> list[bool]:
    """Dynamo guard filter of the fast mode: drop the guards on a model's module attributes, which a model used
    for inference does not change between calls (about 1,400 on a small Llama, most of a compiled call's
    cost on a CPU), but keep those on hooks (specmm adds and removes a feature-capture hook per generation),
    on parameters (shape, dtype, device), on `training`, and every guard on anything else."""
    return [not entry.orig_guard.source.is_unspecialized_nn_module() or entry.guard_type in _KEPT_MODULE_GUARDS
            or "hook" in entry.name or entry.name.endswith(".training") for entry in entries]


def graphs_compiled() -> int:
    """How many graphs dynamo has compiled in this process (grows exactly when a call compiled something)."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def _own_code(fn):
    """A copy of function (or bound method) `fn` whose code object is its own."""
    if isinstance(fn, types.MethodType):
        return types.MethodType(_own_code(fn.__func__), fn.__self__)
    own = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    own.__kwdefaults__, own.__dict__ = fn.__kwdefaults__, dict(fn.__dict__)
    return own


def raise_recompile_limits(limit: int = 64) -> None:
    """One compiled callable may hold a graph per shape (batch widths, tree sizes): allow that many."""
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, limit)
    torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit, 4 * limit)


class CompiledForward:
    """`model(**inputs)` through `torch.compile(dynamic=False)`; eager, with one warning, if it cannot compile.

    For a model's own loop outside the engine's rounds (the image sampler's plain decoding): the engine's rounds
    trace every forward into their one graph instead. It is traced as one graph first (`fullgraph=True`, module
    guards skipped). A forward that graph-breaks (GraniteMoeHybrid's eager MoE experts) is compiled again with
    its breaks and every guard, without CUDA graphs, which would record its per-layer frames again on every call.
    """

    def __init__(self, model: nn.Module, mode: str | None = None, backend: str = "inductor"):
        self.model, self.mode, self.backend = model, mode, backend
        raise_recompile_limits()
        self.run_mode = mode  # the mode it runs in: `mode`, or None once a graph break showed it must
        self.compiled = compile_static(model.forward, mode, backend, fullgraph=True)
        self.whole = True  # traced as one graph (False once a graph break showed it cannot)
        self.failed: str | None = None  # why compilation failed, once it has
        self.shapes: set[tuple] = set()

    def __call__(self, **inputs):
        if self.failed is not None or torch.compiler.is_compiling():  # traced into a compiled graph
            return self.model(**inputs)
        inputs = {k: v.contiguous() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
        key = tuple((k, tuple(v.shape), v.dtype) for k, v in sorted(inputs.items()) if isinstance(v, torch.Tensor))
        first = key not in self.shapes
        started = time.perf_counter()
        try:
            out = run_graphed(self.compiled, self.run_mode, **inputs)
        except torch._dynamo.exc.TorchDynamoException as error:  # compilation, not the model, failed
            reason = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            name = type(self.model).__name__
            if self.whole:  # fullgraph tracing failed before anything ran: compile it with its breaks
                self.whole = False
                if self.run_mode == GRAPHED:
                    warnings.warn(f"compile=True: {name} does not trace as one graph ({reason}); it runs compiled "
                                  "without CUDA graphs, which would record it again per layer", RuntimeWarning,
                                  stacklevel=3)
                self.run_mode = None
                self.compiled = compile_static(self.model.forward, None, self.backend)
                return self(**inputs)
            self.failed = reason
            warnings.warn(f"compile=True: {name} could not be compiled ({reason}); running it eager",
                          RuntimeWarning, stacklevel=3)
            return self.model(**inputs)
        if first:
            self.shapes.add(key)
            CompileClock.seconds += time.perf_counter() - started
        return out


class CompiledRound:
    """A whole round (draft forwards, verify, accept, commits, record) as one compiled graph per shape.

    Between the forwards a round has a few hundred small tensor ops; on a small model each compiled call costs
    about as much as its kernels, so one graph for the round removes most of that overhead. `fullgraph=True`: a
    round that does not trace as one graph (a host sync, a data-dependent branch, a drafter dynamo cannot follow)
    fails before it runs anything, and from then on runs eagerly, with one warning naming the reason. Compile
    time goes on the `CompileClock`.
    """

    def __init__(self, step, mode: str | None = None):
        self.step, self.mode = step, mode
        raise_recompile_limits()
        self.compiled = compile_static(step, mode, fullgraph=True)
        self.failed: str | None = None  # why the round could not compile whole, once it could not
        self.repeating_tapes: set[tuple] = set()  # first rounds whose draws the second repeated (`taped_rounds`)

    def __call__(self, *args, **kwargs):
        if self.failed is not None:
            return self.step(*args, **kwargs)
        graphs, started = graphs_compiled(), time.perf_counter()
        state = [*args, *kwargs.values()] if self.mode == GRAPHED else None
        before = StateSnapshot(state) if state is not None else None
        try:
            out = run_graphed(self.compiled, self.mode, *args, **kwargs)
        except torch._dynamo.exc.TorchDynamoException as error:  # tracing failed: nothing of the round has run
            self.failed = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            logger.debug("round trace failure: %s", error)
            warnings.warn(f"compile=True: the round does not compile as one graph ({self.failed}); it runs eagerly",
                          RuntimeWarning, stacklevel=2)
            return self.step(*args, **kwargs)
        if before is not None:  # what the round rebound lives in the graph's pool: copied out
            own_rebound(state, before)
        if graphs_compiled() != graphs:
            CompileClock.seconds += time.perf_counter() - started
        return out


def taped_rounds(eager, whole, device: torch.device, repeating: set[tuple] | None = None, key: tuple = ()):
    """Sampled compiled rounds read their draws from a `DrawTape`, made eagerly from the generators before each round
    in eager mode's order, so `whole` (one graph) can run them. Step signature: (roots, sampling, generators, *rest).

    1. The first round runs `eager` and records its draws.
    2. If a first round of this kind (`key`, e.g. the drafter's settings) drew exactly these before and the round
       after it drew the same, that is known (`repeating`, kept by the caller across generations): every later
       round runs `whole` on this tape.
    3. Else the second round runs `eager` too and records its own tape (some proposers draw differently in their
       first round: a Jacobi window starts from fresh tokens); if it drew as the first, `repeating` learns it.
    4. Every later round refills the tape and runs `whole`.
    """
    repeating = set() if repeating is None else repeating
    tape: DrawTape | None = None
    first: tuple | None = None  # (key, the first round's draws) until the second round has run

    def step(roots, sampling, generators, *rest):
        nonlocal tape, first
        if tape is None:  # 1.
            tape = DrawTape(generators, device)
            out = eager(roots, sampling, tape, *rest)
            first = (key, tuple(tape.entries))
            if first in repeating:  # 2.
                first = None
            else:
                tape = DrawTape(generators, device)  # 3. the second round records
            return out
        if first is not None:  # 3.
            out = eager(roots, sampling, tape, *rest)
            if tuple(tape.entries) == first[1]:
                repeating.add(first)
            first = None
            return out
        tape.refill()  # 4.
        out = whole(roots, sampling, tape, *rest)
        tape.finish()
        return out

    return step


_ROUNDS: dict[tuple, tuple[tuple[weakref.ref, ...], CompiledRound]] = {}


def held_modules(*parts) -> list[nn.Module]:
    """The modules `parts` (a target, a drafter) hold: attributes that are modules, or dicts/lists/tuples of them."""
    found: dict[int, nn.Module] = {}
    for part in parts:
        for value in vars(part).values():
            if isinstance(value, dict):
                value = list(value.values())
            values = value if isinstance(value, (list, tuple)) else [value]
            found.update((id(m), m) for m in values if isinstance(m, nn.Module))
    return list(found.values())


def settings_key(obj) -> tuple:
    """A stable key for an object's settings (an acceptance rule's): its type and plain attributes. `repr` of a class
    without its own is an address, which would make a new round per instance."""
    plain = (int, float, str, bool, type(None))
    return (type(obj), tuple(sorted((k, v) for k, v in getattr(obj, "__dict__", {}).items() if isinstance(v, plain))))


def shared_round(step, key: tuple, modules: list[nn.Module], mode: str | None) -> CompiledRound:
    """The one `CompiledRound` of the unbound `step` for `key` (the caller's types and settings) over exactly these
    `modules`, so new generators over the same models reuse the graphs: guards check a round's Python state, but
    not a module's attributes (dropped for speed, see `module_guard_filter`), hence a round per set of modules."""
    key = (step, mode, key, tuple(sorted(id(m) for m in modules)))
    found = _ROUNDS.get(key)
    if found is not None and all(ref() is not None for ref in found[0]):
        return found[1]
    for stale in [k for k, (refs, _) in _ROUNDS.items() if any(ref() is None for ref in refs)]:
        del _ROUNDS[stale]
    compiled = CompiledRound(step, mode)
    _ROUNDS[key] = (tuple(weakref.ref(m) for m in modules), compiled)
    return compiled
