"""Under CUDA graphs a compiled round may write in place only into static addresses, and its graph replays only
while those addresses stay put. Checked on a CPU with the CUDA-graph mode's host side forced on: every tensor a
round writes is marked static, and the next generation of the same shapes writes the very same buffers."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import specmm
from specmm.core import compiled
from specmm.core.compiled import GRAPHED
from specmm.core.resident import resident
from specmm.drafters import EagleDrafter, ModelDrafter, PromptLookupDrafter
from tests.conftest import left_padded_batch, perturbed_copy, tiny_model
from tests.graph_pool import graphed_on_cpu


def reachable_tensors(roots: list[tuple[str, object]], depth: int = 8) -> dict[int, tuple[torch.Tensor, str]]:
    """Every tensor reachable from `roots` through attributes, dicts, lists and tuples, outside modules (whose
    parameters and buffers are static already): id -> (tensor, path)."""
    seen, found, stack = set(), {}, [(obj, 0, name) for name, obj in roots]
    while stack:
        obj, level, path = stack.pop()
        if id(obj) in seen or level > depth or isinstance(obj, (nn.Module, type)):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            found[id(obj)] = (obj, path)
            continue
        if isinstance(obj, dict):
            items = list(obj.items())
        elif isinstance(obj, (list, tuple)):
            items = list(enumerate(obj))
        elif hasattr(obj, "__dict__"):
            items = list(vars(obj).items())
        else:
            continue
        stack += [(value, level + 1, f"{path}.{key}") for key, value in items]
    return found


def state_of(args: tuple, kwargs: dict) -> dict[int, tuple[torch.Tensor, str]]:
    return reachable_tensors([(f"arg{i}", a) for i, a in enumerate(args)] + list(kwargs.items()))


@pytest.fixture
def pool(monkeypatch):
    """CUDA graphs' rules on a CPU (`tests.graph_pool`): graph outputs overwritten at each step begin."""
    return graphed_on_cpu(monkeypatch)


@pytest.fixture
def round_writes(monkeypatch, pool):
    """Per compiled round: (path, data pointer, static marking) of every reachable tensor the round wrote, and as
    (path, "graph output", None) every tensor the round left bound in its state whose memory the graph itself made:
    under CUDA graphs that is the graph's output pool, which the next replay overwrites while the state still reads
    it (the first GPU run's "accessing tensor output of CUDAGraphs that has been overwritten")."""
    rounds: list[list[tuple[str, int, str | None]]] = []
    made: list[list[torch.Tensor]] = []  # the tensors each graphed call bound into the state (held: no address reuse)
    original_round, original_run = compiled.CompiledRound.__call__, compiled.run_graphed

    def graph_call(fn, mode, *args, **kwargs):
        before = state_of(args, kwargs)
        out = original_run(fn, mode, *args, **kwargs)
        made.append([t for key, (t, _) in state_of(args, kwargs).items() if key not in before])
        return out

    def recording(self, *args, **kwargs):
        tensors = state_of(args, kwargs)
        before = {key: tensor._version for key, (tensor, _) in tensors.items()}
        made.clear()
        out = original_round(self, *args, **kwargs)
        graph_memory = {t.untyped_storage().data_ptr() for tensors_made in made for t in tensors_made}
        rounds.append([(path, tensor.data_ptr(), getattr(tensor, "_dynamo_static_input_type", None))
                       for key, (tensor, path) in tensors.items() if tensor._version != before[key]]
                      + [(path, "graph output", None) for key, (tensor, path) in state_of(args, kwargs).items()
                         if key not in tensors and tensor.untyped_storage().data_ptr() in graph_memory])
        return out

    monkeypatch.setattr(compiled, "run_graphed", graph_call)
    monkeypatch.setattr(compiled.CompiledRound, "__call__", recording)
    return rounds


def llama_case(drafter: str):
    """(target, drafter maker, tree, generate kwargs, the stock tokens to equal or None) of a tiny Llama."""
    target = tiny_model("llama")
    ids, mask = left_padded_batch([3, 6], seed=5)
    kwargs = dict(input_ids=ids, attention_mask=mask, max_new_tokens=10, pad_token_id=0)
    tree = specmm.TreeSpec.dynamic(depth=3, top_k=2, total_tokens=8)
    if drafter == "lookup":
        return target, lambda: PromptLookupDrafter(ngram=2, k=3), specmm.TreeSpec.chain(3), kwargs, None
    if drafter == "eagle":
        torch.manual_seed(0)
        head = EagleDrafter.for_target(target)
        return target, lambda: head, tree, kwargs, None
    draft = perturbed_copy(target, 0.3)
    return target, lambda: ModelDrafter(draft), tree, kwargs, None


def vlm_case(family: str, method: str):
    """A VLM case whose compiled tokens must equal the stock model's greedy `generate` (issue 17's VLM exactness,
    checked here under CUDA graphs' rules rather than once more in `tests/vlm/test_compiled.py`), EOS in mid-run."""
    from tests.vlm.test_drafter import SPECS, drafter_for
    from tests.vlm.test_targets import MAX_NEW, PAD, setup

    model, inputs, eos, reference = setup(family)
    drafter = drafter_for(model, method)  # one drafter: its head owns its resident buffers
    kwargs = dict(inputs, max_new_tokens=MAX_NEW, eos_token_id=eos, pad_token_id=PAD)
    return model, lambda: drafter, SPECS["dynamic"], kwargs, reference


# SSM targets: `tests/ssm/test_compiled.py` plays the same rules over new generators per generation, the pool's
# `skipped` and `rerecorded` there standing for this test's static-write and same-buffer checks
CASES = {"llama, model drafter": lambda: llama_case("model"), "llama, prompt lookup": lambda: llama_case("lookup"),
         "llama, eagle": lambda: llama_case("eagle"), "qwen2.5-vl, vispec": lambda: vlm_case("qwen2_5_vl", "vispec"),
         **{f"qwen2.5-vl, {m}": (lambda m=m: vlm_case("qwen2_5_vl", m)) for m in ("eagle", "msd", "dream", "flash")},
         "llava, vispec": lambda: vlm_case("llava", "vispec")}


@pytest.mark.parametrize("case", list(CASES))
def test_a_graphed_round_writes_only_static_buffers_that_the_next_generation_reuses(round_writes, pool, case):
    target, make_drafter, tree, kwargs, reference = CASES[case]()
    eager = specmm.SpeculativeGenerator(target, make_drafter(), tree=tree).generate(**kwargs)
    generations = []
    for _ in range(2):  # a new generator (and model drafter) each time, as benchmarks make them: same shapes
        round_writes.clear()
        out = specmm.SpeculativeGenerator(target, make_drafter(), tree=tree, compile=True).generate(**kwargs)
        assert torch.equal(out.sequences, eager.sequences)
        assert reference is None or torch.equal(out.sequences, reference), f"{case}: compiled != stock generate"
        assert round_writes, "no round ran as one compiled graph"
        generations.append((out.sequences.clone(), out.sequences, round_writes[-1]))
    for _, _, writes in generations:
        assert any(path.startswith("arg") for path, _, _ in writes)  # the engine's state at least
        not_static = [path for path, _, marking in writes if marking is None]
        assert not_static == [], f"written or rebound outside static buffers: {not_static}"
    assert {(p, ptr) for p, ptr, _ in generations[0][2]} == {(p, ptr) for p, ptr, _ in generations[1][2]}
    assert torch.equal(generations[0][0], generations[0][1])  # the first result is not overwritten by the second
    # every graph's outputs were overwritten at the next step (tokens stayed right), and no graph would be skipped
    assert pool.poisoned > 0 and pool.skipped == pool.hosted == pool.rerecorded == []


def test_resident_buffers_belong_to_one_owner_name_and_shape_and_only_under_cuda_graphs():
    owner, other = nn.Linear(1, 1), nn.Linear(1, 1)
    first = resident(owner, "counts", torch.tensor([1, 2]), GRAPHED)
    again = resident(owner, "counts", torch.tensor([3, 4]), GRAPHED)
    assert again is first and again.tolist() == [3, 4] and first._dynamo_static_input_type == "unguarded"
    assert resident(owner, "counts", torch.tensor([1, 2, 3]), GRAPHED) is not first  # another shape
    assert resident(owner, "rounds", torch.tensor([1, 2]), GRAPHED) is not first  # another name
    assert resident(other, "counts", torch.tensor([1, 2]), GRAPHED) is not first  # another owner
    fresh = torch.tensor([5, 6])
    assert resident(owner, "counts", fresh, None) is fresh  # no CUDA graphs: the fresh tensor, untouched
