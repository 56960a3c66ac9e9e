"""Compiled mode (`compile=True`): the same tokens as eager and HF `generate`, the target's law when
sampling, and at most one host sync per round. Few and small: every new shape costs a compile.

These run the suite's capture backend (`tests.conftest.CAPTURE_BACKEND`: dynamo's graphs, run as captured), the
same graphs over the same static caches without kernel codegen (inductor's C++ compile would make the suite minutes
longer on 2 cores); `test_compiled_kernels` runs inductor's kernels themselves."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import NamedTuple

import pytest
import torch

import specmm
from specmm.core import compiled as compiled_mode
from specmm.core.compiled import GRAPHED, run_graphed
from specmm.core.static_cache import StaticRowCache
from specmm.drafters import EagleDrafter, ModelDrafter
from tests.conftest import left_padded_batch, perturbed_copy, tiny_model
from tests.core.test_engine_sampling import SAMPLINGS, TREES, assert_matches, exact_joint, models

TREE_KINDS = {"chain": specmm.TreeSpec.chain(3), "dynamic": specmm.TreeSpec.dynamic(depth=3, top_k=2, total_tokens=8)}


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma"])
def test_compiled_greedy_equals_generate_and_eager_on_a_ragged_batch_with_eos(arch, capture_only):
    for name, tree in TREE_KINDS.items():
        ragged_batch_with_eos_equals_generate(arch, name, tree)


def test_a_compiled_static_tree_runs_every_round_as_one_graph(capture_only):
    """A static tree's layout is computed with its spec, not cached on first use inside the first round's graph
    (dynamo cannot take a cached_property's lock: the round would run per part from then on)."""
    target = tiny_model("llama")
    draft = perturbed_copy(target, 0.3)
    ids, mask = left_padded_batch([3, 8, 5], seed=4)
    kwargs = dict(attention_mask=mask, max_new_tokens=12, pad_token_id=0)
    choices = [[0], [1], [0, 0], [0, 0, 0]]
    compiled = specmm.SpeculativeGenerator(target, ModelDrafter(draft), tree=specmm.TreeSpec.static(choices),
                                           compile=True)  # a spec no eager round has read before
    out = compiled.generate(ids, **kwargs)
    assert compiled.whole_round, "the round did not compile as one graph"
    reference = target.generate(ids, do_sample=False, **kwargs)
    assert torch.equal(out.sequences, reference)


def ragged_batch_with_eos_equals_generate(arch: str, name: str, tree: specmm.TreeSpec) -> None:
    """Compiled greedy tokens of a ragged batch (row 1 stops at EOS early) equal HF `generate` and eager mode's,
    with the same per-row forwards; a second call compiles nothing; the round runs as one graph."""
    target = tiny_model(arch)
    draft = perturbed_copy(target, 0.3)
    ids, mask = left_padded_batch([3, 8, 5], seed=4)
    free = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=16, pad_token_id=0)
    eos = int(free[1, ids.shape[1] + 6])  # row 1 stops early, the others run on
    reference = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=16, pad_token_id=0,
                                eos_token_id=eos)
    kwargs = dict(attention_mask=mask, max_new_tokens=16, eos_token_id=eos, pad_token_id=0)
    eager = specmm.SpeculativeGenerator(target, ModelDrafter(draft), tree=tree).generate(ids, **kwargs)
    compiled = specmm.SpeculativeGenerator(target, ModelDrafter(draft), tree=tree, compile=True)
    out = compiled.generate(ids, **kwargs)
    width = reference.shape[1]
    assert torch.equal(out.sequences[:, :width], reference), f"{arch}/{name}: compiled != generate"
    assert torch.equal(out.sequences, eager.sequences), f"{arch}/{name}: compiled != eager"
    assert out.stats.target_forwards_per_row == eager.stats.target_forwards_per_row
    assert out.stats.accepted_histogram == eager.stats.accepted_histogram
    again = compiled.generate(ids, **kwargs)  # same shapes: nothing is compiled a second time
    assert torch.equal(again.sequences, out.sequences) and again.stats.compile_time_s == 0.0
    assert compiled.whole_round, f"{arch}/{name}: the round did not compile as one graph"


def test_compiled_eagle_greedy_equals_generate(capture_only):
    target = tiny_model("llama")
    torch.manual_seed(0)
    drafter = EagleDrafter.for_target(target)
    ids, mask = left_padded_batch([4, 7], seed=2)
    reference = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=12, pad_token_id=0)
    gen = specmm.SpeculativeGenerator(target, drafter, tree=TREE_KINDS["dynamic"], compile=True)
    out = gen.generate(ids, attention_mask=mask, max_new_tokens=12, pad_token_id=0)
    assert torch.equal(out.sequences, reference)
    assert gen.whole_round  # the whole round as one graph: forwards, tree growth, walk, commits


def test_sampled_compiled_rounds_run_as_one_graph_with_eager_modes_seeded_tokens(capture_only):
    """Per-row generators, a ragged batch: rounds after the second read their draws from a tape made eagerly from
    the same generators in the same order, so the tokens are eager mode's, row by row. The rounds that record the
    tape run eagerly, so the whole-round graph is the one graph the generation compiles."""
    target = tiny_model("llama")
    draft = perturbed_copy(target, 0.3)
    ids, mask = left_padded_batch([3, 8, 5], seed=4)
    sampling = specmm.SamplingConfig(temperature=0.9, top_k=20)
    for name, tree in TREE_KINDS.items():
        outputs, graphs = [], compiled_mode.graphs_compiled()
        for compile in (False, True):
            gen = specmm.SpeculativeGenerator(target, ModelDrafter(draft), tree=tree, compile=compile)
            generators = [torch.Generator().manual_seed(7 + row) for row in range(3)]
            outputs.append(gen.generate(ids, attention_mask=mask, max_new_tokens=16, sampling=sampling,
                                        generator=generators, pad_token_id=0))
        eager, compiled = outputs
        assert torch.equal(compiled.sequences, eager.sequences), f"{name}: compiled != eager"
        assert compiled.stats.accepted_histogram == eager.stats.accepted_histogram
        assert min(compiled.stats.target_forwards_per_row) > 2 and gen.whole_round, name
        graphs = compiled_mode.graphs_compiled() - graphs
        assert graphs == 1, f"{name}: {graphs} graphs"


@pytest.mark.parametrize("tree_name", ["chain-sampled", "dynamic-deterministic"])
def test_compiled_sampling_matches_the_target_law(tree_name, capture_only):
    target, draft = models()
    sampling = SAMPLINGS["t0.7"]
    gen = specmm.SpeculativeGenerator(target, ModelDrafter(draft), tree=TREES[tree_name], compile=True)
    prompt = torch.tensor([[3, 1, 4, 1, 5]]).expand(4000, -1)
    generator = torch.Generator().manual_seed(5)
    counts = torch.zeros(8 ** 3, dtype=torch.long)
    for _ in range(2):
        new = gen.generate(prompt, max_new_tokens=3, sampling=sampling, generator=generator).sequences[:, 5:]
        counts += torch.bincount(new[:, 0] * 64 + new[:, 1] * 8 + new[:, 2], minlength=8 ** 3)
    assert_matches(counts, exact_joint(target, sampling))


@contextmanager
def counting_host_syncs():
    """Count the tensor -> host conversions a block makes (item, tolist, bool, int, float, nonzero)."""
    calls = []
    names = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "nonzero")
    originals = {name: getattr(torch.Tensor, name) for name in names}

    def wrap(name):
        def counted(self, *args, **kwargs):
            calls.append(name)
            return originals[name](self, *args, **kwargs)
        return counted

    for name in names:
        setattr(torch.Tensor, name, wrap(name))
    try:
        yield calls
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


def graphs_made(run) -> int:
    """Graphs dynamo makes while `run()` runs, from a reset: none an earlier test made is reused."""
    torch._dynamo.reset()
    before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    run()
    return torch._dynamo.utils.counters["stats"]["unique_graphs"] - before


@pytest.mark.parametrize("kind", ["model", "prompt lookup", "eagle"])
def test_a_greedy_compiled_generation_runs_its_first_round_through_the_later_rounds_graph(kind, capture_only):
    """The state a drafter's `start` leaves has the later rounds' shapes (pending slots padded to the tree's depth
    + 1; EAGLE runs the prompt but its root there), so a greedy generation compiles one graph, first round included,
    where the first round's parts took a dozen; tokens stay `generate`'s."""
    target = tiny_model("llama")
    torch.manual_seed(0)
    drafters = {"model": lambda: ModelDrafter(perturbed_copy(target, 0.3)),
                "prompt lookup": lambda: specmm.drafters.PromptLookupDrafter(ngram=2, k=3),
                "eagle": lambda: EagleDrafter.for_target(target)}
    ids, mask = left_padded_batch([1, 7, 4], seed=5)  # a one-token prompt too: EAGLE's lone (0, x_0) slot
    reference = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=10, pad_token_id=0)
    gen = specmm.SpeculativeGenerator(target, drafters[kind](), tree=specmm.TreeSpec.chain(3), compile=True)
    outs = []
    graphs = graphs_made(lambda: outs.append(gen.generate(ids, attention_mask=mask, max_new_tokens=10,
                                                          pad_token_id=0)))
    assert torch.equal(outs[0].sequences, reference)
    assert outs[0].stats.target_forwards > 2 and graphs == 1, f"{kind}: {graphs} graphs"


def test_another_budget_or_pad_id_compiles_nothing_new(capture_only):
    """max_new_tokens and the pad id are values of the round's state, not constants of its graph: a server that
    varies the budget within a length bucket (here 10 and 13, both under 16 slots) or the pad id reuses the one
    graph; tokens stay `generate`'s."""
    target = tiny_model("llama")
    gen = specmm.SpeculativeGenerator(target, ModelDrafter(perturbed_copy(target, 0.3)),
                                      tree=specmm.TreeSpec.chain(3), compile=True)
    ids, mask = left_padded_batch([1, 7, 4], seed=5)
    outs = {}

    def run(budget: int, pad: int = 0) -> None:
        outs[budget, pad] = gen.generate(ids, attention_mask=mask, max_new_tokens=budget, pad_token_id=pad,
                                         eos_token_id=None)

    assert graphs_made(lambda: run(10)) == 1
    before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    run(13)
    run(13, pad=5)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == before, "a new budget or pad compiled a graph"
    for (budget, pad), out in outs.items():
        reference = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=budget,
                                    pad_token_id=pad, eos_token_id=None)
        assert torch.equal(out.sequences, reference), (budget, pad)


def test_a_compiled_round_makes_at_most_one_host_sync(capture_only):
    """Host conversions of a whole generate, minus those of a one-round generate (input checks, the final
    counts), are at most one per extra round."""
    target = tiny_model("llama")
    draft = perturbed_copy(target, 0.3)
    ids, mask = left_padded_batch([3, 6], seed=1)
    gen = specmm.SpeculativeGenerator(target, ModelDrafter(draft), tree=TREE_KINDS["dynamic"], compile=True)
    sampling = specmm.SamplingConfig(temperature=0.8)

    def syncs(max_new_tokens: int) -> tuple[int, int, list[str]]:
        generator = torch.Generator().manual_seed(0)
        with counting_host_syncs() as calls:
            out = gen.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, sampling=sampling,
                               generator=generator, pad_token_id=0)
        return len(calls), out.stats.target_forwards, calls

    syncs(12)  # compile every shape outside the count
    one_round, rounds_one, _ = syncs(1)
    many, rounds, calls = syncs(12)
    assert rounds_one == 1 and rounds > 3
    assert many - one_round <= rounds - 1, f"{many - one_round} host syncs over {rounds - 1} extra rounds: {calls}"


def test_compiled_mode_uses_static_caches_and_warns_for_parts_without_one(capture_only):
    target = tiny_model("llama")
    ids, _ = left_padded_batch([4], seed=3)
    gen = specmm.SpeculativeGenerator(target, ModelDrafter(target), tree=specmm.TreeSpec.chain(2), compile=True)
    gen.begin(ids, torch.ones_like(ids), max_new_tokens=4)
    assert isinstance(gen.target.runner.cache, StaticRowCache)
    assert isinstance(gen.drafter.runner.cache, StaticRowCache)
    gen.end()

    class NoStaticDrafter(ModelDrafter):
        def __getattribute__(self, name):
            if name == "static_plan":
                raise AttributeError(name)
            return super().__getattribute__(name)

    with pytest.warns(RuntimeWarning, match="drafter NoStaticDrafter has no static-cache path"):
        specmm.SpeculativeGenerator(target, NoStaticDrafter(target), tree=specmm.TreeSpec.chain(2), compile=True)


def test_rows_that_stop_early_stay_in_a_compiled_batch_without_overflowing_its_cache(capture_only):
    """A row that stops (at EOS, or at its budget before slower rows) keeps committing its root while the
    others run on; the static cache holds it at its limit and every row's tokens equal eager mode's."""
    target = tiny_model("llama")
    ids, mask = left_padded_batch([2, 9, 5, 7], seed=6)
    free = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=4, pad_token_id=0)
    eos = int(free[0, ids.shape[1]])  # row 0 stops at once (and others when they emit it)
    cases = [(specmm.drafters.PromptLookupDrafter(ngram=1, k=2), eos), (ModelDrafter(perturbed_copy(target, 0.2)), [])]
    for drafter, eos in cases:
        kwargs = dict(attention_mask=mask, max_new_tokens=110, eos_token_id=eos, pad_token_id=0)
        eager = specmm.SpeculativeGenerator(target, drafter, tree=specmm.TreeSpec.chain(2)).generate(ids, **kwargs)
        gen = specmm.SpeculativeGenerator(target, drafter, tree=specmm.TreeSpec.chain(2), compile=True)
        out = gen.generate(ids, **kwargs)
        assert torch.equal(out.sequences, eager.sequences)
        assert gen.whole_round  # prompt lookup too: its history has the plan's width, so nothing reads the host
        rounds = out.stats.target_forwards_per_row
        assert max(rounds) > 40 and max(rounds) - min(rounds) > 5  # stopped rows sat through many rounds


def breaking_llama(monkeypatch):
    """A tiny Llama whose every layer's MLP graph-breaks: dynamo compiles each layer's rest as a frame all layers
    share."""
    target = tiny_model("llama")
    for layer in target.model.layers:
        def mlp_with_a_break(*args, _forward=layer.mlp.forward, **kwargs):
            torch._dynamo.graph_break()
            return _forward(*args, **kwargs)
        monkeypatch.setattr(layer.mlp, "forward", mlp_with_a_break)
    return target


def test_a_target_that_graph_breaks_inside_its_layers_decodes_the_eager_tokens(capture_only, monkeypatch):
    """A break in every layer's MLP compiles each layer's rest as a frame shared by all layers; their guards
    (layer_idx, ...) must survive the fast path's guard filter, or layer 0's graph would run for layer 1."""
    target, draft = breaking_llama(monkeypatch), tiny_model("llama", seed=5, num_hidden_layers=1)
    ids, mask = left_padded_batch([4, 7], seed=1)
    chain = specmm.TreeSpec.chain(2)  # each per-part graph is a trace of its own: the shortest chain
    eager = specmm.SpeculativeGenerator(target, ModelDrafter(draft), tree=chain).generate(ids, mask, max_new_tokens=8)
    compiled = specmm.SpeculativeGenerator(target, ModelDrafter(draft), tree=chain, compile=True)
    with pytest.warns(RuntimeWarning, match=r"the round does not compile as one graph \(") as seen:
        assert torch.equal(compiled.generate(ids, mask, max_new_tokens=8).sequences, eager.sequences)
        assert torch.equal(compiled.generate(ids, mask, max_new_tokens=8).sequences, eager.sequences)
    assert len([w for w in seen if "one graph" in str(w.message)]) == 1 and not compiled.whole_round  # once


def test_under_cuda_graphs_a_target_that_graph_breaks_inside_its_layers_runs_eagerly(monkeypatch):
    """Under CUDA graphs' rules (`tests.graph_pool`) a round whose target breaks inside every layer cannot be one
    graph: the generation runs eagerly, with one warning naming the reason, and records no CUDA graph at all (a
    per-layer frame would be recorded again at every layer); the eager tokens."""
    from tests.graph_pool import graphed_on_cpu

    target, draft = breaking_llama(monkeypatch), tiny_model("llama", seed=5, num_hidden_layers=1)
    ids, mask = left_padded_batch([4, 7], seed=1)
    chain = specmm.TreeSpec.chain(2)
    eager = specmm.SpeculativeGenerator(target, ModelDrafter(draft), tree=chain).generate(ids, mask, max_new_tokens=8)
    pool = graphed_on_cpu(monkeypatch)
    compiled = specmm.SpeculativeGenerator(target, ModelDrafter(draft), tree=chain, compile=True)
    with pytest.warns(RuntimeWarning) as seen:
        for _ in range(2):
            assert torch.equal(compiled.generate(ids, mask, max_new_tokens=8).sequences, eager.sequences)
    warned = [str(w.message) for w in seen if "one graph" in str(w.message)]
    assert len(warned) == 1 and warned[0].endswith("it runs eagerly"), warned
    assert compiled.whole_round is False and pool.calls == 0 and pool.rerecorded == pool.skipped == []


def test_a_round_traced_with_a_feature_hook_is_not_run_without_it(capture_only):
    """An EAGLE round captures the target's features through a hook on its final norm; a plain drafter's round over
    the same target and shapes has no hook. Alternating them, each compiled generation accepts exactly as its eager
    twin does: no round runs a graph traced with a hook since removed, or without the hook it needs."""
    target = tiny_model("llama")
    ids, mask = left_padded_batch([3, 6], seed=5)
    torch.manual_seed(0)
    head = EagleDrafter.for_target(target)
    draft = perturbed_copy(target, 0.3)
    tree = specmm.TreeSpec.chain(3)
    makers = {"eagle": lambda: head, "model": lambda: ModelDrafter(draft)}
    expected = {name: specmm.SpeculativeGenerator(target, make(), tree=tree).generate(ids, mask, max_new_tokens=10)
                for name, make in makers.items()}
    for name in ("eagle", "model", "eagle", "model"):
        gen = specmm.SpeculativeGenerator(target, makers[name](), tree=tree, compile=True)
        out = gen.generate(ids, mask, max_new_tokens=10)
        assert torch.equal(out.sequences, expected[name].sequences) and gen.whole_round, name
        assert out.stats.accepted_histogram == expected[name].stats.accepted_histogram, name
        assert not target.model.norm._forward_hooks, "the feature hook outlived its generation"


class _Pair(NamedTuple):
    first: torch.Tensor
    second: torch.Tensor


@dataclass
class _Result:
    tokens: torch.Tensor
    pair: _Pair
    cache: object


def test_graphed_calls_hand_out_copies_of_their_outputs_but_keep_caches():
    """Under CUDA graphs a graph's outputs live in buffers the next replay overwrites: `run_graphed` copies every
    output tensor (in model outputs, named tuples, dataclasses, lists) and keeps other objects, such as a cache
    whose buffers the graph updates in place."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    cache, logits, tokens, a, b = object(), torch.randn(1, 2, 5), torch.arange(3), torch.ones(2), torch.zeros(2)

    def compiled(**inputs):
        return (CausalLMOutputWithPast(logits=logits, past_key_values=cache), _Result(tokens, _Pair(a, b), cache),
                [a])

    steps = []
    original = torch.compiler.cudagraph_mark_step_begin
    torch.compiler.cudagraph_mark_step_begin = lambda: steps.append(1)
    try:
        output, result, listed = run_graphed(compiled, GRAPHED, x=1)
    finally:
        torch.compiler.cudagraph_mark_step_begin = original
    assert steps == [1]  # each graphed call is a step of its own
    pairs = [(output.logits, logits), (output["logits"], logits), (result.tokens, tokens), (result.pair.first, a),
             (result.pair.second, b), (listed[0], a)]
    for copied, original_tensor in pairs:
        assert torch.equal(copied, original_tensor)
        assert copied.untyped_storage().data_ptr() != original_tensor.untyped_storage().data_ptr()
    assert output.past_key_values is cache and result.cache is cache and isinstance(result.pair, _Pair)
    plain = compiled()
    assert run_graphed(compiled, None)[1].tokens is tokens and plain[1].tokens is tokens  # other modes: as is
