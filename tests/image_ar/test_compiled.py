"""Compiled image sampling (`ImageSampler(compile=True)`): greedy AR tokens with guidance for Jacobi and the
drafter, the LlamaGen fixtures, the target's law for exact SD and SJD, and one host sync per round.

Graphs are captured with the aot_eager backend (see tests/core/test_compiled.py): the same static-shape graphs
over the same static caches, without inductor's kernel codegen, which would make the suite minutes longer."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from specmm.core.engine import SpeculativeGenerator
from specmm.core.tree import TreeSpec
from specmm.image_ar import ImageDrafter, ImageSampler, LanternPP, LlamaGen, lantern_pp_tree
from specmm.image_ar.compiled import compile_failures
from tests.core.test_compiled import counting_host_syncs
from tests.image_ar import test_sampler_distribution as distribution
from tests.image_ar.conftest import tiny_llamagen
from tests.image_ar.llamagen.test_fixtures import FIXTURES

CONDITIONS = torch.tensor([1, 3, 5])


@pytest.fixture(autouse=True)
def capture_only(monkeypatch):
    monkeypatch.setattr("specmm.core.compiled.BACKEND", "aot_eager")


def greedy(sampler: ImageSampler, conditions: torch.Tensor = CONDITIONS, cfg_scale: float = 3.0) -> torch.Tensor:
    return sampler.sample(conditions, cfg_scale=cfg_scale, temperature=0.0, decode=False).tokens


def test_compiled_greedy_equals_ar_with_guidance_for_jacobi_and_the_drafter(lg):
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
    # LANTERN++ over its static tree: relaxed greedy acceptance compiled, the same tokens as in eager mode
    lantern = [ImageSampler(lg, proposer=drafter, acceptance=LanternPP(k=4, lam=3.0), tree=lantern_pp_tree(),
                            compile=mode) for mode in (False, True)]
    assert torch.equal(greedy(lantern[1]), greedy(lantern[0]))
    assert compile_failures(lg.gpt, drafter.head) == []


@pytest.mark.skipif(not FIXTURES.is_dir(), reason="LlamaGen fixtures not available")
@pytest.mark.parametrize("kind", ["c2i", "t2i"])
def test_llamagen_fixtures_through_the_compiled_sampler(kind):
    lg = LlamaGen.from_checkpoint(FIXTURES / f"gpt_{kind}.pt", FIXTURES / "vq.pt", FIXTURES / f"gpt_{kind}_config.json",
                                  FIXTURES / "vq_config.json", image_size=8)
    expected = load_file(FIXTURES / f"gpt_{kind}_expected.safetensors")
    cond = expected["cond"]
    assert torch.equal(greedy(ImageSampler(lg, proposer="ar", compile=True), cond, 1.0), expected["greedy_nocfg"])
    assert torch.equal(greedy(ImageSampler(lg, proposer="jacobi", window=4, compile=True), cond, 4.0),
                       expected["greedy_cfg4"])


@pytest.fixture(scope="module")
def small():
    return tiny_llamagen(vocab=4, block=4, seed=3)  # the distribution tests' model: 256 possible images


def test_compiled_sjd_samples_the_target_distribution(small):
    distribution._check(small, ImageSampler(small, proposer="jacobi", acceptance="sjd", window=4, compile=True))


def test_compiled_exact_drafter_samples_the_target_distribution(small):
    torch.manual_seed(1)
    drafter = ImageDrafter.for_target(small.gpt)
    distribution._check(small, ImageSampler(small, proposer=drafter, acceptance="exact", tree=TreeSpec.chain(2),
                                            compile=True))


def test_a_compiled_round_makes_no_host_sync_and_the_loop_one(lg, small, monkeypatch):
    """Inside the round step nothing reaches the host; a generation's other syncs (input checks, the final stats,
    the loop's one per round) grow by at most one per extra round."""
    in_steps = []
    real_step = SpeculativeGenerator.step

    def counted_step(self, *args, **kwargs):
        with counting_host_syncs() as calls:
            out = real_step(self, *args, **kwargs)
        in_steps.extend(calls)
        return out

    monkeypatch.setattr(SpeculativeGenerator, "step", counted_step)

    def syncs(model) -> tuple[int, int]:
        sampler = ImageSampler(model, proposer="jacobi", acceptance="sjd", window=3, compile=True)
        kwargs = dict(cfg_scale=2.0, temperature=1.0, top_k=3, decode=False)
        sampler.sample(CONDITIONS[:2], generator=torch.Generator().manual_seed(0), **kwargs)  # compile outside
        with counting_host_syncs() as calls:
            out = sampler.sample(CONDITIONS[:2], generator=torch.Generator().manual_seed(0), **kwargs)
        return len(calls), out.stats.target_forwards

    few, rounds_few = syncs(small)  # 4 image tokens
    many, rounds_many = syncs(lg)  # 16 image tokens
    assert in_steps == [] and rounds_many > rounds_few
    assert many - few <= rounds_many - rounds_few
