"""Compiled image sampling (`ImageSampler(compile=True)`): greedy AR tokens with guidance for Jacobi and the
drafter, the LlamaGen fixtures, the target's law for exact SD and SJD, and one host sync per round.

Graphs are captured by dynamo and run as captured (the suite's `CAPTURE_BACKEND`; the fixture checks go through AOT
autograd too, with "aot_eager", which functionalises the in-place cache writes as inductor does): the same
static-shape graphs over the same static caches, without inductor's kernel codegen, which would make the suite
minutes longer. The whole file also passes with SPECMM_TEST_BACKEND=aot_eager (about three times slower)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from specmm.core.engine import SpeculativeGenerator
from specmm.core.tree import TreeSpec
from specmm.image_ar import GSD, ImageDrafter, ImageSampler, Lantern, LlamaGen
from specmm.image_ar.compiled import compile_failures
from tests.core.test_compiled import counting_host_syncs
from tests.image_ar import test_sampler_distribution as distribution
from tests.image_ar.conftest import tiny_llamagen
from tests.image_ar.llamagen.test_fixtures import FIXTURES

CONDITIONS = torch.tensor([1, 3, 5])
pytestmark = pytest.mark.usefixtures("capture_only")


def greedy(sampler: ImageSampler, conditions: torch.Tensor = CONDITIONS, cfg_scale: float = 3.0) -> torch.Tensor:
    return sampler.sample(conditions, cfg_scale=cfg_scale, temperature=0.0, decode=False).tokens


def test_compiled_greedy_equals_ar_with_guidance_for_jacobi_and_the_drafter(lg):
    """Three rows finishing at different rounds; AR, Jacobi (repeat-up init), a dynamic drafter tree, and GSD's
    relaxed greedy rule, all compiled."""
    reference = greedy(ImageSampler(lg, proposer="ar"))
    assert torch.equal(greedy(ImageSampler(lg, proposer="ar", compile=True)), reference)
    jacobi = ImageSampler(lg, proposer="jacobi", init="repeat_up", window=6, compile=True)
    assert torch.equal(greedy(jacobi), reference)
    drafter = ImageDrafter.for_target(lg.gpt)
    dynamic = ImageSampler(lg, proposer=drafter, tree=TreeSpec.dynamic(depth=3, top_k=3, total_tokens=8), compile=True)
    out = dynamic.sample(CONDITIONS, cfg_scale=3.0, temperature=0.0, decode=False)
    assert torch.equal(out.tokens, reference) and out.stats.compile_time_s > 0
    rows = out.stats.target_forwards_per_row
    assert max(rows) > min(rows)  # rows finished at different rounds and stayed in the compiled batch
    again = dynamic.sample(CONDITIONS, cfg_scale=3.0, temperature=0.0, decode=False)  # same shapes: no compile
    assert torch.equal(again.tokens, reference) and again.stats.compile_time_s == 0.0
    # GSD: relaxed greedy acceptance compiled (Jacobi's graphs reused), the same tokens as in eager mode
    gsd = [ImageSampler(lg, proposer="jacobi", init="repeat_up", window=6, acceptance=GSD(window=5, p_gap=0.5),
                        compile=mode) for mode in (False, True)]
    assert torch.equal(greedy(gsd[1]), greedy(gsd[0]))
    assert compile_failures(lg.gpt, drafter.head) == []


@pytest.mark.parametrize("method", ["lantern", "gsd"])
def test_compiled_relaxed_rules_sample_the_same_tokens_as_eager(lg, method):
    """Per-row generators: each row's draws are its own, so rows kept in the compiled batch after they finish change
    nothing, and LANTERN (drafter, dynamic tree) and GSD (Jacobi) sample eager mode's tokens and moved mass, with
    every round after the second run as one graph."""
    drafter = ImageDrafter.for_target(lg.gpt)

    def sample(compile: bool):
        if method == "lantern":
            sampler = ImageSampler(lg, proposer=drafter, acceptance=Lantern(k=4, delta=0.2), compile=compile,
                                   tree=TreeSpec.dynamic(depth=3, top_k=3, total_tokens=8))
        else:
            sampler = ImageSampler(lg, proposer="jacobi", acceptance=GSD(window=5, p_gap=0.5), window=6,
                                   compile=compile)
        gens = [torch.Generator().manual_seed(10 + i) for i in range(3)]
        return sampler, sampler.sample(CONDITIONS, cfg_scale=2.0, top_k=16, generator=gens, decode=False)

    (_, eager), (sampler, compiled) = sample(False), sample(True)
    assert torch.equal(compiled.tokens, eager.tokens) and compiled.stats.moved_mass == eager.stats.moved_mass > 0
    assert sampler.whole_round  # sampled rounds as one graph each, their draws read from a tape


@pytest.mark.skipif(not FIXTURES.is_dir(), reason="LlamaGen fixtures not available")
@pytest.mark.parametrize("kind", ["c2i", "t2i"])
def test_llamagen_fixtures_through_the_compiled_sampler(kind, monkeypatch):
    """Upstream's greedy tokens with guidance from the compiled Jacobi sampler (AOT-functionalised graphs)."""
    monkeypatch.setattr("specmm.core.compiled.BACKEND", "aot_eager")
    lg = LlamaGen.from_checkpoint(FIXTURES / f"gpt_{kind}.pt", FIXTURES / "vq.pt", FIXTURES / f"gpt_{kind}_config.json",
                                  FIXTURES / "vq_config.json", image_size=8)
    expected = load_file(FIXTURES / f"gpt_{kind}_expected.safetensors")
    cond = expected["cond"]
    jacobi = ImageSampler(lg, proposer="jacobi", window=4, compile=True)
    assert torch.equal(greedy(jacobi, cond, 4.0), expected["greedy_cfg4"])


@pytest.fixture(scope="module")
def small():
    return tiny_llamagen(vocab=4, block=4, seed=3)  # the distribution tests' model: 256 possible images


def sjd(model) -> ImageSampler:
    return ImageSampler(model, proposer="jacobi", acceptance="sjd", window=4, compile=True)


def test_compiled_sjd_samples_the_target_distribution(small):
    distribution._check(small, sjd(small))


def test_compiled_exact_drafter_samples_the_target_distribution(small):
    torch.manual_seed(1)
    drafter = ImageDrafter.for_target(small.gpt)
    distribution._check(small, ImageSampler(small, proposer=drafter, acceptance="exact", tree=TreeSpec.chain(2),
                                            compile=True))


def test_a_compiled_round_makes_no_host_sync_and_the_loop_one_per_round(small, monkeypatch):
    """Nothing inside the round step reaches the host; the loop reads one verdict per round (stopped rows and
    non-finite logits together) and the moved mass once at the end. Same shapes as the SJD test: no compile. The
    counting wrapper cannot be traced, so the round runs part by part here (one RuntimeWarning says so) and every
    part's syncs are counted; `test_compiled_relaxed_rules_sample_the_same_tokens_as_eager` asserts that the
    unpatched round is one graph."""
    counted = {"step": [], "loop": []}

    def counting(name, real):
        def wrapper(self, *args, **kwargs):
            with counting_host_syncs() as calls:
                out = real(self, *args, **kwargs)
            counted[name].extend(calls)
            return out
        return wrapper

    monkeypatch.setattr(SpeculativeGenerator, "step", counting("step", SpeculativeGenerator.step))
    monkeypatch.setattr(SpeculativeGenerator, "_loop", counting("loop", SpeculativeGenerator._loop))
    out = sjd(small).sample(torch.full((distribution.SAMPLES,), distribution.CLASS), cfg_scale=distribution.SCALE,
                            top_k=3, generator=torch.Generator().manual_seed(1), decode=False)
    rounds = out.stats.target_forwards - 1  # the first token comes from the conditioning prefill
    assert counted["step"] == [] and rounds >= 2
    assert len(counted["loop"]) <= rounds + 1, counted["loop"]


def test_under_cuda_graph_rules_every_proposer_gives_eager_tokens_and_no_round_is_skipped(monkeypatch):
    """With CUDA graphs' rules played on the CPU (`tests.graph_pool`: a graph's outputs are overwritten at the next
    step; a graph writing in place into a tensor that is not static, or over static tensors that moved, would not be
    replayed), AR, Jacobi, a drafter tree, and LANTERN and GSD sampling (taped whole rounds) give eager mode's tokens.
    Samplers are made afresh and interleaved, as a benchmark's rows are: every generation of a shape replays the
    graphs over the same buffers."""
    from tests.graph_pool import graphed_on_cpu

    lg = tiny_llamagen(seed=4)  # a model of its own: its graphs are made under the pool's rules
    reference = greedy(ImageSampler(lg, proposer="ar"))
    drafter = ImageDrafter.for_target(lg.gpt)

    def sampled(compile: bool):
        lantern = ImageSampler(lg, proposer=drafter, acceptance=Lantern(k=4, delta=0.2), compile=compile,
                               tree=TreeSpec.dynamic(depth=3, top_k=3, total_tokens=8))
        gsd = ImageSampler(lg, proposer="jacobi", acceptance=GSD(window=5, p_gap=0.5), window=6, compile=compile)
        return [s.sample(CONDITIONS, cfg_scale=2.0, top_k=16, decode=False,
                         generator=[torch.Generator().manual_seed(10 + i) for i in range(3)]).tokens
                for s in (lantern, gsd)]

    eager = sampled(False)
    pool = graphed_on_cpu(monkeypatch)
    greedy_samplers = [lambda: ImageSampler(lg, proposer="ar", compile=True),
                       lambda: ImageSampler(lg, proposer="jacobi", init="repeat_up", window=6, compile=True),
                       lambda: ImageSampler(lg, proposer=drafter, compile=True,
                                            tree=TreeSpec.dynamic(depth=3, top_k=3, total_tokens=8))]
    for _ in range(2):
        for make in greedy_samplers:
            assert torch.equal(greedy(make()), reference)
    for compiled_tokens, eager_tokens in zip(sampled(True), eager):
        assert torch.equal(compiled_tokens, eager_tokens)
    assert pool.poisoned > 0 and pool.skipped == pool.hosted == pool.rerecorded == []
