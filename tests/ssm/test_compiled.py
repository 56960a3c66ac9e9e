"""Compiled mode for SSM targets: STree greedy under `compile=True` gives HF `generate`'s tokens.

The SSM target's verify (layout, conv-window gather, tree scan, attention over a static KV cache) and its state
commit compile with the suite's capture backend (`tests.conftest.CAPTURE_BACKEND`), which captures the same graphs
without generating kernels (inductor codegen would take minutes of the suite on 2 cores). The draft model stays
eager here: the core's tests compile drafters, and `tests/bench/test_ssm.py` compiles both together, the
replay-rollback commit included.
"""

from __future__ import annotations

import pytest
import torch

import specmm
from specmm.bench.fast_path import compiled_parts
from specmm.core import compiled as compiled_mode
from specmm.core.sampling import GREEDY
from specmm.core.static_cache import StaticRowCache
from specmm.drafters import ModelDrafter
from specmm.ssm import SSMTarget
from specmm.ssm.steps import tree_steps
from tests.conftest import left_padded_batch
from tests.core.test_compiled import counting_host_syncs
from tests.ssm.conftest import COMPILED_ARCHS, VOCAB, aligned_drafter_model, tiny_ssm
from tests.ssm.test_generate import LENGTHS, NEW_TOKENS, greedy_case

# shallower trees than the eager tests' (`tests.ssm.test_generate.TREES`, depth 5): every draft step is a drafter
# forward traced into the round's graph, and each trace is seconds of the suite
TREES = {"chain": specmm.TreeSpec.chain(3),
         "static": specmm.TreeSpec.static([[0], [1], [0, 0], [1, 0], [0, 0, 0]]),
         "dynamic": specmm.TreeSpec.dynamic(depth=3, top_k=2, total_tokens=7)}


pytestmark = pytest.mark.usefixtures("capture_only")


def ragged_eos(reference: torch.Tensor) -> int:
    """A token some row emits mid-way and some other row never emits: rows stop at different rounds."""
    rows = reference.tolist()
    return next(t for row in rows for t in row[2:-2] if any(t not in other for other in rows))


def stops_at(reference: torch.Tensor, eos: int) -> list[int]:
    """Each row's token count when generation stops after its first `eos` (or the budget)."""
    lengths = []
    for row in reference:
        hits = (row == eos).nonzero()
        lengths.append(int(hits[0]) + 1 if len(hits) else NEW_TOKENS)
    return lengths


@pytest.mark.parametrize("arch", COMPILED_ARCHS)
def test_compiled_stree_greedy_equals_hf_generate_on_a_ragged_batch_with_eos(arch):
    """Rows that meet EOS stay in the compiled batch (static shapes) while the others run on, exactly; each round,
    the tree scan and the state commit included, runs as one graph over the model's shared steps."""
    target, draft, ids, mask, reference = greedy_case(arch)
    eos = ragged_eos(reference)
    gen = specmm.SpeculativeGenerator(target, ModelDrafter(draft), tree=TREES["dynamic"], compile=True)
    steps = tree_steps(target, gen.target.mixers)  # the fast mode's steps, shared by every adapter of the model
    out = gen.generate(ids, mask, max_new_tokens=NEW_TOKENS, eos_token_id=eos, pad_token_id=0)
    new = out.sequences[:, ids.shape[1]:]
    lengths = stops_at(reference, eos)
    for row, stop in enumerate(lengths):
        assert torch.equal(new[row, :stop], reference[row, :stop]), f"{arch} row {row}: compiled != generate"
        assert (new[row, stop:] == 0).all()
    assert min(lengths) < NEW_TOKENS == max(lengths) and out.stats.mean_accepted > 1.0
    assert gen.target.steps is steps and gen.whole_round and out.stats.compile_time_s > 0
    if arch == "bamba":
        again = gen.generate(ids, mask, max_new_tokens=NEW_TOKENS, eos_token_id=eos, pad_token_id=0)
        assert torch.equal(again.sequences, out.sequences) and again.stats.compile_time_s == 0.0  # nothing new
        roots = gen.begin(ids, mask, max_new_tokens=NEW_TOKENS)
        assert isinstance(gen.target.kv, StaticRowCache) and gen.target.kv.allocated  # the hybrid's attention KV
        tree = gen.drafter.draft(roots, gen.tree, GREEDY, None)
        path = torch.zeros(len(LENGTHS), tree.max_depth + 1, dtype=torch.long)
        with counting_host_syncs() as calls:  # the target's part of a compiled round never waits on the device
            gen.target.verify(tree)
            gen.target.commit(path, torch.ones(len(LENGTHS), dtype=torch.long))
        assert calls == []
        gen.end()


def test_a_round_that_cannot_compile_warns_with_the_reason_and_runs_eagerly(monkeypatch):
    """The core's fallback reaches the SSM target: a verify that graph-breaks makes the round untraceable as one
    graph, so the generation runs eagerly, with one warning naming the reason, the same tokens, and benchmarks see
    nothing compiled."""
    target = tiny_ssm("mamba2", seed=3)
    draft = aligned_drafter_model(target, residual_scale=16.0)
    ids, mask = left_padded_batch([6], vocab=VOCAB, seed=2)
    reference = target.generate(ids, max_new_tokens=8, do_sample=False)
    gen = specmm.SpeculativeGenerator(target, ModelDrafter(draft), tree=TREES["chain"], compile=True)
    verify = tree_steps(target, gen.target.mixers).verify
    original = type(verify).forward

    def breaking(self, **inputs):
        torch._dynamo.graph_break()
        return original(self, **inputs)

    monkeypatch.setattr(type(verify), "forward", breaking)
    with pytest.warns(RuntimeWarning, match=r"the round does not compile as one graph \(") as seen:
        out = gen.generate(ids, mask, max_new_tokens=8)
        again = gen.generate(ids, mask, max_new_tokens=8)
    assert len([w for w in seen if "one graph" in str(w.message)]) == 1  # once, not once per round
    assert torch.equal(out.sequences, reference) and torch.equal(again.sequences, reference)
    assert gen.whole_round is False and compiled_parts(gen) == []  # benchmarks report nothing compiled


def test_a_compiled_draft_and_stree_run_each_round_as_one_graph_with_generates_tokens():
    """Hybrid target (tree scan + static attention KV) and a compiled drafter: every round traces as one graph, the
    first included (its prompt nodes are a tensor, so it has the later rounds' shapes), which is the one graph a
    greedy generation compiles; the tree mixers stay installed for the generation, inert outside a tree pass."""
    target, draft, ids, mask, reference = greedy_case("bamba")
    gen = specmm.SpeculativeGenerator(target, ModelDrafter(draft), tree=TREES["dynamic"], compile=True)
    graphs = compiled_mode.graphs_compiled()
    out = gen.generate(ids, mask, max_new_tokens=NEW_TOKENS, pad_token_id=0)
    assert torch.equal(out.sequences[:, ids.shape[1]:], reference) and gen.whole_round
    assert compiled_mode.graphs_compiled() - graphs == 1
    one = gen.generate(ids[:1], mask[:1], max_new_tokens=NEW_TOKENS, pad_token_id=0)  # batch 1: shapes of its own
    assert torch.equal(one.sequences[:, ids.shape[1]:], reference[:1]) and gen.whole_round
    assert compiled_mode.graphs_compiled() - graphs == 2
    assert all("forward" not in mixer.__dict__ for mixer in gen.target.mixers.values())  # stock mixers again
    assert torch.equal(target.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False,
                                       pad_token_id=0)[:, ids.shape[1]:], reference)


@pytest.mark.parametrize("arch", COMPILED_ARCHS)
def test_under_cuda_graph_rules_stree_gives_generates_tokens_and_no_graph_is_skipped(arch, monkeypatch):
    """CUDA graphs' rules played on the CPU (`tests.graph_pool`): the verify's and commit's outputs are overwritten at
    the next step, and every state a graph writes in place (SSM and conv states, the hybrid's KV cache) must be
    static. Draft and target compiled, two generations by new generators (as benchmarks make them) over the same
    buffers, HF `generate`'s tokens each time: a state written in place outside static buffers is `skipped`, one the
    second generation holds at other addresses `rerecorded`. The chain with the replay-rollback commit too (the
    vanilla baseline of `bench ssm`). GraniteMoeHybrid has its own test below: its forward graph-breaks inside the
    layer loop, so it runs without CUDA graphs."""
    from tests.graph_pool import graphed_on_cpu

    target, draft, ids, mask, reference = greedy_case(arch)
    pool = graphed_on_cpu(monkeypatch)
    # every arch runs the dynamic tree; the static tree and the replay commit once each, on the pure SSM and the
    # hybrid (each config compiles graphs of its own: the suite's time)
    more = {"mamba2": [("chain", "replay")], "bamba": [("static", "closed_form")]}.get(arch, [])
    for tree, commit in [("dynamic", "closed_form"), *more]:
        adapter = SSMTarget(target, commit_mode=commit)
        for _ in range(2):
            gen = specmm.SpeculativeGenerator(adapter, ModelDrafter(draft), tree=TREES[tree], compile=True)
            out = gen.generate(ids, mask, max_new_tokens=NEW_TOKENS, pad_token_id=0)
            assert torch.equal(out.sequences[:, ids.shape[1]:], reference), f"{arch}, {tree} tree, {commit}"
    assert pool.poisoned > 0 and pool.skipped == pool.hosted == pool.rerecorded == []


def test_under_cuda_graph_rules_a_model_that_graph_breaks_per_layer_runs_eagerly_with_one_warning(monkeypatch):
    """GraniteMoeHybrid's eager MoE experts graph-break inside the layer loop, so its round cannot be one graph (under
    CUDA graphs a per-layer frame would be recorded again per layer). The generation runs eagerly instead: HF
    `generate`'s tokens, no CUDA graph recorded, one warning naming the reason."""
    from tests.graph_pool import graphed_on_cpu

    target, draft, ids, mask, reference = greedy_case("granite_hybrid")
    pool = graphed_on_cpu(monkeypatch)
    gen = specmm.SpeculativeGenerator(SSMTarget(target), ModelDrafter(draft), tree=TREES["chain"], compile=True)
    with pytest.warns(RuntimeWarning) as caught:
        for _ in range(2):
            out = gen.generate(ids, mask, max_new_tokens=NEW_TOKENS, pad_token_id=0)
            assert torch.equal(out.sequences[:, ids.shape[1]:], reference)
    assert pool.calls == 0 and pool.skipped == pool.hosted == pool.rerecorded == []
    warned = [str(w.message) for w in caught if "one graph" in str(w.message)]
    assert len(warned) == 1 and warned[0].endswith("it runs eagerly"), [str(w.message) for w in caught]
    assert gen.whole_round is False
