"""End to end through SpeculativeGenerator: greedy tokens equal HF `generate`, sampling equals the target's law.

Greedy: a batch of three prompts of different lengths (left-padded) must give, row by row, exactly the tokens
of `model.generate(do_sample=False)` on the unpadded prompt, for Mamba2, Bamba, NemotronH, Zamba2, Falcon-H1 and
GraniteMoeHybrid, with chains,
static and dynamic trees, and for the vanilla baseline (chain + replay rollback). Sampling: the joint law of
the first three new tokens (vocabulary 8) passes a chi-square test against the exactly enumerated target law
(Mamba2; Falcon-H1 and GraniteMoeHybrid on 8k samples, the suite's time).
"""

from __future__ import annotations

import functools

import pytest
import torch
from scipy.stats import chisquare

import specmm
from specmm.core.sampling import process_logits
from specmm.drafters import ModelDrafter
from specmm.ssm import SSMTarget
from tests.conftest import left_padded_batch, report_acceptance
from tests.ssm.conftest import ARCHS, VOCAB, aligned_drafter_model, tiny_ssm

LENGTHS = [5, 11, 2]
NEW_TOKENS = 14
TREES = {
    "chain": specmm.TreeSpec.chain(3),
    "static": specmm.TreeSpec.static([[0], [1], [0, 0], [1, 0], [0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0, 0]]),
    "dynamic": specmm.TreeSpec.dynamic(depth=5, top_k=2, total_tokens=9),
}


@functools.cache
def greedy_case(arch: str):
    """(target, drafter model, input_ids, attention_mask, reference new tokens [B, NEW_TOKENS])."""
    target = tiny_ssm(arch)
    draft = aligned_drafter_model(target, residual_scale=16.0 if arch == "mamba2" else 4.0)
    ids, mask = left_padded_batch(LENGTHS, vocab=VOCAB, seed=1)
    with torch.no_grad():
        reference = torch.cat([target.generate(ids[r:r + 1, ids.shape[1] - n:], max_new_tokens=NEW_TOKENS,
                                               do_sample=False)[:, n:] for r, n in enumerate(LENGTHS)])
    return target, draft, ids, mask, reference


@pytest.mark.parametrize("tree", list(TREES))
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_tree_decoding_equals_hf_generate(arch, tree):
    target, draft, ids, mask, reference = greedy_case(arch)
    gen = specmm.SpeculativeGenerator(target, ModelDrafter(draft), tree=TREES[tree])
    out = gen.generate(ids, mask, max_new_tokens=NEW_TOKENS)
    assert torch.equal(out.sequences[:, ids.shape[1]:], reference)
    assert out.stats.mean_accepted > 1.0  # some drafts were accepted
    report_acceptance(f"ssm greedy {arch} {tree}", out.stats)


@pytest.mark.parametrize("arch", ARCHS)
def test_vanilla_chain_with_replay_rollback_equals_hf_generate(arch):
    target, draft, ids, mask, reference = greedy_case(arch)
    gen = specmm.SpeculativeGenerator(SSMTarget(target, commit_mode="replay"), ModelDrafter(draft),
                                      tree=TREES["chain"])
    out = gen.generate(ids, mask, max_new_tokens=NEW_TOKENS)
    assert torch.equal(out.sequences[:, ids.shape[1]:], reference)


@pytest.mark.parametrize("seed", [0, 2])
def test_step_size_limits_clamp_prompt_tokens_only_as_generate_does(seed):
    """HF clamps Δ to time_step_limit in its prefill (chunk path) but not in its one-token decode step: a binding
    limit changes tokens unless verification clamps exactly the prompt's tokens (its last one is the first root)."""
    target = tiny_ssm("mamba2", seed=seed, time_step_limit=(0.5, 0.6))
    draft = aligned_drafter_model(target, residual_scale=1.0)
    ids, mask = left_padded_batch(LENGTHS, vocab=VOCAB, seed=1)
    with torch.no_grad():
        reference = torch.cat([target.generate(ids[r:r + 1, ids.shape[1] - n:], max_new_tokens=NEW_TOKENS,
                                               do_sample=False)[:, n:] for r, n in enumerate(LENGTHS)])
    for tree in (TREES["chain"], TREES["dynamic"]):
        out = specmm.SpeculativeGenerator(target, ModelDrafter(draft), tree=tree).generate(
            ids, mask, max_new_tokens=NEW_TOKENS)
        assert torch.equal(out.sequences[:, ids.shape[1]:], reference)


# ------------------------------------------------------------------------------------------------ sampling

SMALL_VOCAB = 8
SAMPLES, CHUNK = 12_000, 4_000
PROMPT = torch.tensor([[3, 1, 4, 1, 5, 7]])
SAMPLING = specmm.SamplingConfig(temperature=0.8)


@functools.cache
def sampling_models(arch: str = "mamba2"):
    target = tiny_ssm(arch, vocab=SMALL_VOCAB, logit_scale=8.0)
    return target, aligned_drafter_model(target, residual_scale=3.0)


def exact_joint(model) -> torch.Tensor:
    """[V^3] probability of each three-token continuation of PROMPT under the processed target."""
    v = SMALL_VOCAB
    with torch.no_grad():
        first = process_logits(model(PROMPT).logits[0, -1], SAMPLING)
        one = torch.arange(v)[:, None]
        second = process_logits(model(torch.cat([PROMPT.expand(v, -1), one], 1)).logits[:, -1], SAMPLING)
        pairs = torch.cartesian_prod(torch.arange(v), torch.arange(v))
        third = process_logits(model(torch.cat([PROMPT.expand(v * v, -1), pairs], 1)).logits[:, -1], SAMPLING)
    return (first[:, None, None] * second[:, :, None] * third.view(v, v, v)).double().flatten()


@pytest.mark.parametrize("arch, tree, samples", [("mamba2", "chain", SAMPLES), ("mamba2", "dynamic", SAMPLES),
                                                 ("falcon_h1", "dynamic", 8_000), ("granite_hybrid", "chain", 8_000)])
def test_sampled_tree_decoding_matches_the_target_distribution(arch, tree, samples):
    target, draft = sampling_models(arch)
    spec = specmm.TreeSpec.chain(2) if tree == "chain" else specmm.TreeSpec.dynamic(depth=3, top_k=2, total_tokens=7)
    gen = specmm.SpeculativeGenerator(target, ModelDrafter(draft), tree=spec)
    generator = torch.Generator().manual_seed(0)
    v, counts = SMALL_VOCAB, torch.zeros(SMALL_VOCAB ** 3, dtype=torch.long)
    for _ in range(samples // CHUNK):
        out = gen.generate(PROMPT.expand(CHUNK, -1), max_new_tokens=3, sampling=SAMPLING, generator=generator)
        new = out.sequences[:, PROMPT.shape[1]:]
        counts += torch.bincount(new[:, 0] * v * v + new[:, 1] * v + new[:, 2], minlength=v ** 3)
    probs = exact_joint(target)
    expected = probs / probs.sum() * counts.sum()
    assert counts[probs == 0].sum() == 0
    small = expected < 5
    observed = torch.cat([counts[~small].double(), counts[small].sum(0, keepdim=True).double()])
    wanted = torch.cat([expected[~small], expected[small].sum(0, keepdim=True)])
    keep = wanted > 0
    assert chisquare(observed[keep].numpy(), wanted[keep].numpy()).pvalue > 1e-3
    assert out.stats.mean_accepted > 1.1  # drafts were accepted, so the acceptance rule was exercised
    report_acceptance(f"ssm sampled {arch} {tree}", out.stats)


@pytest.mark.parametrize("arch", ["mamba2", "bamba"])
def test_rows_that_stop_early_leave_the_batch_and_the_rest_stay_exact(arch):
    """An EOS met by one row mid-way: that row is dropped (states and KV rows selected), the others go on."""
    target, draft, ids, mask, reference = greedy_case(arch)
    # an EOS that row 1 meets mid-way and some other row never meets
    eos = next(int(t) for t in reference[1, 2:] if any(int(t) not in r.tolist() for r in reference))
    gen = specmm.SpeculativeGenerator(target, ModelDrafter(draft), tree=TREES["dynamic"])
    out = gen.generate(ids, mask, max_new_tokens=NEW_TOKENS, eos_token_id=eos, pad_token_id=0)
    new = out.sequences[:, ids.shape[1]:]
    lengths = []
    for row in range(len(LENGTHS)):
        hits = (reference[row] == eos).nonzero()
        stop = int(hits[0]) + 1 if len(hits) else NEW_TOKENS
        lengths.append(stop)
        assert torch.equal(new[row, :stop], reference[row, :stop])
        assert (new[row, stop:] == 0).all()
    assert min(lengths) < NEW_TOKENS == max(lengths)  # ragged: row 1 stopped early, another ran to the end
