"""CUDA graphs' rules, on a CPU: outputs overwritten at the next step, in-place writes only into static tensors.

Under `torch.compile(mode="reduce-overhead")` a graph's outputs live in its memory pool. After
`torch.compiler.cudagraph_mark_step_begin()` (specmm calls it before every graphed call) the next replay writes
into that pool, so any tensor specmm still holds from an earlier call's outputs (a rebound drafter attribute, a
hook's captured features) silently changes. `GraphPool` plays that on a CPU: its backend records each call's
outputs (those not sharing memory with the call's inputs, which the graph updates in place), and each step
begin poisons every recorded output: NaN for floats, a huge index for integers, flipped booleans. A compiled
path that holds a graph's output across steps then gives wrong tokens or fails, as it would on a GPU.

The pool also lists what would make CUDA-graph trees run a graph without CUDA graphs or record it again:
- `skipped`: a call wrote in place into an input that is not static (not a parameter, buffer or
  `mark_static_address`ed tensor);
- `rerecorded`: a static input is at another address than at the graph's last call (the trees record again, and
  after 128 times stop graphing the function);
- `hosted`: a tensor factory without a device inside a graph, which on a GPU makes a CPU tensor.

`graphed_on_cpu(monkeypatch)` puts compiled mode (core engine, image sampler, SSM targets) in its CUDA-graph mode:
graphs compiled for that mode run on the pool, the others (helpers compiled without CUDA graphs) plainly, all on the
suite's capture backend (`tests.conftest.CAPTURE_BACKEND`; SPECMM_TEST_BACKEND=aot_eager functionalises them as
inductor's are, without kernel codegen).
"""

from __future__ import annotations

import sys

import torch
from torch import Tensor
from torch.utils._pytree import tree_leaves

from specmm.core import compiled
from specmm.core.compiled import GRAPHED
from tests.conftest import CAPTURE_BACKEND

POISON_INDEX = 2**30  # an integer output read after it was overwritten indexes far out of range


def poison(tensor: Tensor) -> None:
    """Overwrite `tensor` as a later replay would: with values no correct computation could use."""
    with torch.no_grad():
        if tensor.dtype == torch.bool:
            tensor.logical_not_()
        elif tensor.is_floating_point() or tensor.is_complex():
            tensor.fill_(float("nan"))
        else:
            tensor.fill_(min(POISON_INDEX, torch.iinfo(tensor.dtype).max))


class GraphPool:
    """The outputs of graphed calls since the last step begin, overwritten at the next; counts what it poisoned."""

    def __init__(self):
        self.outputs: list[Tensor] = []  # held, so their memory is not reused before they are poisoned
        self.calls = 0
        self.poisoned = 0
        self.hosted: list[str] = []  # factories in graphs that would make CPU tensors on a GPU
        self.skipped: list[str] = []  # graphs CUDA-graph trees would not record: they mutate a non-static input
        self.rerecorded: list[str] = []  # calls whose static inputs moved since the graph's last call: recorded again

    def record(self, inputs: tuple, outputs, mutated: list[str], name: str) -> None:
        """One graphed call: its outputs (not its inputs' memory) to poison at the next step, and the non-static
        inputs it wrote in place (by placeholder name)."""
        held = {a.untyped_storage().data_ptr() for a in tree_leaves(inputs) if isinstance(a, Tensor)}
        self.calls += 1
        if mutated:
            self.skipped.append(f"{name}: mutated non-static inputs {mutated}")
        self.outputs += [t for t in tree_leaves(outputs) if isinstance(t, Tensor) and t.numel() > 0
                         and t.untyped_storage().data_ptr() not in held]

    def step_begin(self) -> None:
        """Overwrite every recorded output's memory once (outputs that view one storage share it: poisoning each
        view in turn would flip a boolean back)."""
        storages: dict[int, Tensor] = {}
        for tensor in self.outputs:
            storages.setdefault(tensor.untyped_storage().data_ptr(), tensor)
        for tensor in storages.values():
            storage = tensor.untyped_storage()
            poison(tensor.new_empty(0).set_(storage, 0, (storage.nbytes() // tensor.element_size(),)))
        self.poisoned += len(self.outputs)
        self.outputs.clear()


FACTORIES = (torch.arange, torch.zeros, torch.ones, torch.full, torch.empty, torch.tensor, torch.as_tensor, torch.eye,
             torch.linspace, torch.rand, torch.randn, torch.randint)
"""Tensor factories that make a CPU tensor unless given a device: inside a graph on a GPU, a CPU tensor."""

ACTIVE: GraphPool | None = None  # the pool of the running test (a graph compiled under an earlier one records here)


def pooled_backend(graph: torch.fx.GraphModule, example_inputs: list[Tensor]):
    """The suite's capture backend, each call's outputs recorded in the active pool, with the inputs it mutated that
    are not static (parameters, buffers and `mark_static_address`ed tensors are): the trees run such a graph without
    CUDA graphs. Mutations are read off the inputs' version counters, so the graph needs no functionalising."""
    if CAPTURE_BACKEND == "aot_eager":
        from torch._dynamo.backends.debugging import aot_eager

        run = aot_eager(graph, example_inputs)
    else:
        run = graph
    name = _where(next((n for n in graph.graph.nodes if n.op == "call_function"), None)) or "graph"
    placeholders = [n.name for n in graph.graph.nodes if n.op == "placeholder"]
    if ACTIVE is not None:
        ACTIVE.hosted += [f"{name}: {node.target.__name__} without a device, at {_where(node)}"
                          for node in graph.graph.nodes if node.op == "call_function" and node.target in FACTORIES
                          and node.kwargs.get("device") is None]

    last_static: list[tuple[int, int]] | None = None  # (input, address) of the static inputs at the last call

    def replay(*args):
        nonlocal last_static
        static = [(i, a.data_ptr()) for i, a in enumerate(args)
                  if isinstance(a, Tensor) and getattr(a, "_dynamo_static_input_type", None) is not None]
        if ACTIVE is not None and last_static is not None and static != last_static:
            moved = sorted({placeholders[i] for i, _ in set(static) ^ set(last_static)})
            ACTIVE.rerecorded.append(f"{name}: static inputs moved {moved}")
        last_static = static
        versions = [a._version if isinstance(a, Tensor) else None for a in args]
        out = run(*args)
        mutated = [placeholders[i] for i, (a, v) in enumerate(zip(args, versions))
                   if v is not None and a._version != v and getattr(a, "_dynamo_static_input_type", None) is None]
        if ACTIVE is not None:
            ACTIVE.record(args, out, mutated, name)
        return out

    return replay


def _where(node: torch.fx.Node | None) -> str:
    """The source line a graph node was traced from ('' when unknown)."""
    trace = node.meta.get("stack_trace", "").strip().splitlines() if node is not None else []
    return " ".join(line.strip() for line in trace[-2:])


def graphed_on_cpu(monkeypatch, pool: GraphPool | None = None) -> GraphPool:
    """Compiled mode's CUDA-graph path on a CPU, its graphs run by `pool` (a new one by default)."""
    pool = pool or GraphPool()
    plain = compiled.compile_static

    def compile_static(fn, mode=None, backend=None, fullgraph=False):
        return plain(fn, mode, pooled_backend if mode == GRAPHED else CAPTURE_BACKEND, fullgraph)

    monkeypatch.setattr(sys.modules[__name__], "ACTIVE", pool)
    monkeypatch.setattr(compiled, "BACKEND", CAPTURE_BACKEND)
    monkeypatch.setattr(compiled, "compile_static", compile_static)
    monkeypatch.setattr("specmm.core.engine.graph_mode", lambda device: GRAPHED)
    monkeypatch.setattr("specmm.image_ar.compiled.graph_mode", lambda device: GRAPHED)
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", pool.step_begin)
    return pool


__all__ = ["GraphPool", "graphed_on_cpu", "poison", "pooled_backend"]
