"""`tests.graph_pool`, the CPU stand-in for CUDA graphs' rules, catches what a GPU run would: a graph output held past
the next step, and a graph that writes in place into a tensor that is not static."""

from __future__ import annotations

import pytest
import torch

import specmm
from specmm.core import compiled
from specmm.core.compiled import GRAPHED, compiled_forward, run_graphed
from specmm.drafters import ModelDrafter
from tests.conftest import left_padded_batch, perturbed_copy, tiny_model
from tests.graph_pool import GraphPool, graphed_on_cpu, poison


class Doubler(torch.nn.Module):
    def forward(self, x, counts):
        counts.add_(1)  # in place into an input
        return x * 2, x  # a fresh output and an alias of the input


@pytest.fixture
def pool(monkeypatch) -> GraphPool:
    return graphed_on_cpu(monkeypatch)


def test_outputs_are_overwritten_at_the_next_step_and_inputs_never(pool):
    step = compiled_forward(Doubler(), GRAPHED)
    x, counts = torch.tensor([1.0, 2.0]), torch.zeros(2, dtype=torch.long)
    torch._dynamo.mark_static_address(counts)
    doubled, same = step.compiled(x, counts)  # a raw graph call, as a rebound attribute would hold it
    owned, _ = run_graphed(step.compiled, GRAPHED, x, counts)  # specmm's call: copied out of the pool
    assert torch.isnan(doubled).all()  # overwritten by the second step
    assert owned.tolist() == [2.0, 4.0] and same.tolist() == x.tolist() == [1.0, 2.0]  # inputs are not the pool's
    assert counts.tolist() == [2, 2] and pool.skipped == []


def test_a_graph_writing_into_a_tensor_that_is_not_static_is_reported(pool):
    step = compiled_forward(Doubler(), GRAPHED)
    step(x=torch.ones(2), counts=torch.zeros(2, dtype=torch.long))
    assert len(pool.skipped) == 1 and "counts" in pool.skipped[0]


@pytest.mark.parametrize(("dtype", "poisoned"), [(torch.float32, "nan"), (torch.long, 2**30), (torch.bool, False),
                                                 (torch.int8, 127)])
def test_poison_leaves_no_usable_value(dtype, poisoned):
    tensor = torch.ones(3, dtype=dtype)
    poison(tensor)
    assert torch.isnan(tensor).all() if poisoned == "nan" else (tensor == poisoned).all()


def test_the_pool_catches_state_a_round_rebinds_when_it_is_not_copied_out(monkeypatch, pool):
    """The second GPU run's failure, replayed: without `own_rebound` a model drafter keeps its `pending` tokens in
    the graph's pool; at the next round they are overwritten, and the generation fails or goes wrong."""
    target = tiny_model("llama")
    ids, mask = left_padded_batch([3, 6], seed=5)
    kwargs = dict(input_ids=ids, attention_mask=mask, max_new_tokens=10, pad_token_id=0)
    tree = specmm.TreeSpec.chain(3)
    draft = perturbed_copy(target, 0.3)
    eager = specmm.SpeculativeGenerator(target, ModelDrafter(draft), tree=tree).generate(**kwargs)
    good = specmm.SpeculativeGenerator(target, ModelDrafter(draft), tree=tree, compile=True).generate(**kwargs)
    assert torch.equal(good.sequences, eager.sequences)
    monkeypatch.setattr(compiled, "own_rebound", lambda state, before: None)
    try:
        bad = specmm.SpeculativeGenerator(target, ModelDrafter(draft), tree=tree, compile=True).generate(**kwargs)
    except (IndexError, RuntimeError):
        return  # a poisoned index read by a later round
    assert not torch.equal(bad.sequences, eager.sequences)


class Hosted(torch.nn.Module):
    def forward(self, x):
        return x + torch.arange(x.shape[0]) + torch.zeros(x.shape[0], device=x.device)


def test_a_factory_without_a_device_is_reported(pool):
    """On a GPU, `torch.arange(n)` inside a graph makes a CPU tensor: a device mismatch, or CUDA graphs skipped."""
    compiled_forward(Hosted(), GRAPHED)(x=torch.ones(3))
    assert len(pool.hosted) == 1 and "arange" in pool.hosted[0]


def test_a_static_input_at_a_new_address_is_recorded_again(pool):
    """The trees record a graph again when a static input moves (and after 128 times stop graphing it): state that
    is allocated afresh per generation must be resident instead (`specmm.core.resident`)."""
    step = compiled_forward(Doubler(), GRAPHED)
    counts = torch.zeros(2, dtype=torch.long)
    torch._dynamo.mark_static_address(counts)
    for _ in range(2):
        step(x=torch.ones(2), counts=counts)  # same address: one recording
    assert pool.rerecorded == []
    moved = torch.zeros(2, dtype=torch.long)
    torch._dynamo.mark_static_address(moved)
    step(x=torch.ones(2), counts=moved)
    assert len(pool.rerecorded) == 1 and "counts" in pool.rerecorded[0]


class Flags(torch.nn.Module):
    def forward(self, x):
        flags = x > 0
        return flags, flags[:1]  # two outputs over one storage


def test_outputs_that_share_memory_are_overwritten_once(pool):
    """A boolean flipped once per view would be flipped back: each storage is poisoned once, as a replay would."""
    step = compiled_forward(Flags(), GRAPHED)
    flags, first = step.compiled(torch.tensor([1.0, -1.0]))
    step.compiled(torch.tensor([1.0, -1.0]))  # specmm's next call begins a step
    pool.step_begin()
    assert flags.tolist() == [False, True] and first.tolist() == [False]
