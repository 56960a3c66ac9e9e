"""Greedy exactness: speculative tokens equal the target's own `generate(do_sample=False)`, token for token."""

from __future__ import annotations

import functools

import pytest
import torch

import specmm
from specmm.drafters import EagleDrafter, ModelDrafter, PromptLookupDrafter
from tests.conftest import ARCHITECTURES, left_padded_batch, perturbed_copy, report_acceptance, tiny_model

PROMPT_LENGTHS = [5, 11, 3, 8]
MAX_NEW = 24
PAD = 0

SPECS = {
    "chain1": specmm.TreeSpec.chain(1),
    "chain3": specmm.TreeSpec.chain(3),
    "chain8": specmm.TreeSpec.chain(8),
    "static": specmm.TreeSpec.static([[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1]]),
    "dynamic": specmm.TreeSpec.dynamic(depth=4, top_k=3, total_tokens=14),
}


def _pick_eos(new_tokens: torch.Tensor) -> int:
    """A token some rows produce early and at least one row never produces."""
    rows = [set(r.tolist()) for r in new_tokens]
    early = [set(r[: MAX_NEW // 2].tolist()) for r in new_tokens]
    for token in sorted(set().union(*early)):
        hits = sum(token in r for r in rows)
        if token != PAD and 0 < hits < len(rows):
            return token
    raise AssertionError("no token separates the rows; change the prompts")


@functools.cache
def setup(arch: str):
    """(target, drafters by name, input_ids, attention_mask, eos, reference sequences)."""
    target = tiny_model(arch)
    ids, mask = left_padded_batch(PROMPT_LENGTHS, seed=1)
    free = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW, pad_token_id=PAD)
    eos = _pick_eos(free[:, ids.shape[1]:])
    reference = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW,
                                eos_token_id=eos, pad_token_id=PAD)
    drafters = {"self": target, "random": tiny_model("llama", seed=99), "perturbed": perturbed_copy(target, 0.3)}
    return target, drafters, ids, mask, eos, reference


@pytest.mark.parametrize("spec_name", list(SPECS))
@pytest.mark.parametrize("drafter_name", ["self", "random", "perturbed"])
@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_greedy_tokens_equal_target_generate(arch, drafter_name, spec_name):
    target, drafters, ids, mask, eos, reference = setup(arch)
    spec = SPECS[spec_name]
    gen = specmm.SpeculativeGenerator(target, ModelDrafter(drafters[drafter_name]), tree=spec)
    out = gen.generate(ids, attention_mask=mask, max_new_tokens=MAX_NEW, eos_token_id=eos, pad_token_id=PAD)
    report_acceptance(f"{arch}/{drafter_name}/{spec_name}", out.stats)

    assert torch.equal(out.sequences, reference)
    stopped = [(row[ids.shape[1]:] == eos).any().item() for row in reference]
    assert any(stopped) and not all(stopped), "EOS must end some rows and not others"
    histogram = out.stats.accepted_histogram
    if drafter_name == "self":  # the target's own argmax path is always in the tree, so always accepted
        assert histogram[0] == 0
        if spec.kind != "dynamic":  # full depth (EAGLE-2 trees on flat distributions are wide, not deep)
            assert out.stats.mean_accepted > 0.75 * (spec.depth + 1)
    if drafter_name == "random":
        assert histogram[0] > 0.8 * sum(histogram)
    if drafter_name == "perturbed" and spec.depth > 1:  # partial acceptance really happens
        assert histogram[0] > 0 and sum(histogram[1:]) > 0 and sum(histogram[1:spec.depth]) > 0


@pytest.mark.parametrize("arch", ["llama", "mistral"])
def test_greedy_prompt_lookup_equals_target_generate(arch):
    target, _, ids, mask, eos, reference = setup(arch)
    gen = specmm.SpeculativeGenerator(target, PromptLookupDrafter(ngram=2, k=5), tree=specmm.TreeSpec.chain(5))
    out = gen.generate(ids, attention_mask=mask, max_new_tokens=MAX_NEW, eos_token_id=eos, pad_token_id=PAD)
    report_acceptance(f"{arch}/prompt-lookup/chain5", out.stats)
    assert torch.equal(out.sequences, reference)
    assert sum(out.stats.accepted_histogram[1:]) > 0  # repetitive random-model output gives copyable n-grams


@pytest.mark.parametrize("spec_name", ["chain3", "dynamic"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_greedy_eagle_equals_target_generate(arch, spec_name):
    target, _, ids, mask, eos, reference = setup(arch)
    torch.manual_seed(0)
    gen = specmm.SpeculativeGenerator(target, EagleDrafter.for_target(target), tree=SPECS[spec_name])
    out = gen.generate(ids, attention_mask=mask, max_new_tokens=MAX_NEW, eos_token_id=eos, pad_token_id=PAD)
    report_acceptance(f"{arch}/eagle-untrained/{spec_name}", out.stats)
    assert torch.equal(out.sequences, reference)


def test_greedy_eager_attention_equals_target_generate():
    """The additive-mask path (attn_implementation='eager') is exact too.

    float32: HF's own eager float64 forward turns left-padded rows into NaN (fully masked pad queries), so
    `generate` there is no reference; specmm's pad queries see themselves and stay finite.
    """
    target = tiny_model("llama", attn_implementation="eager", dtype=torch.float32)
    ids, mask = left_padded_batch(PROMPT_LENGTHS, seed=1)
    reference = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW, pad_token_id=PAD)
    gen = specmm.SpeculativeGenerator(target, ModelDrafter(perturbed_copy(target, 0.3)), tree=SPECS["dynamic"])
    out = gen.generate(ids, attention_mask=mask, max_new_tokens=MAX_NEW, pad_token_id=PAD)
    assert torch.equal(out.sequences, reference)


def test_greedy_batch_of_one_and_float32_target():
    target = tiny_model("qwen2", dtype=torch.float32)
    ids, _ = left_padded_batch([7], seed=3)
    reference = target.generate(ids, do_sample=False, max_new_tokens=MAX_NEW, pad_token_id=PAD)
    out = specmm.SpeculativeGenerator(target, ModelDrafter(target), tree=SPECS["chain3"]).generate(
        ids, max_new_tokens=MAX_NEW)
    assert torch.equal(out.sequences, reference)


def test_greedy_mixed_full_and_sliding_layers_equal_target_generate():
    """Models mixing full and sliding-window layers get one mask per layer type."""
    target = tiny_model("qwen2", use_sliding_window=True, sliding_window=6, max_window_layers=1)
    assert set(target.config.layer_types) == {"full_attention", "sliding_attention"}
    ids, mask = left_padded_batch(PROMPT_LENGTHS, seed=1)
    reference = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW, pad_token_id=PAD)
    gen = specmm.SpeculativeGenerator(target, ModelDrafter(perturbed_copy(target, 0.3)), tree=SPECS["static"])
    out = gen.generate(ids, attention_mask=mask, max_new_tokens=MAX_NEW, pad_token_id=PAD)
    assert torch.equal(out.sequences, reference)


@pytest.mark.parametrize("compile", [False, True])
def test_greedy_chunked_attention_layers_equal_target_generate(compile, capture_only):
    """Llama 4's chunked layers (keys in the query's block of positions) get their own mask next to the full
    layers', in a ragged batch with EOS, chains and trees alike, eager and compiled (dynamo's graphs, no codegen)."""
    target, drafters, ids, mask, eos, reference = setup("llama4")
    assert set(target.config.layer_types) == {"chunked_attention", "full_attention"}
    for spec in ("dynamic",) if compile else ("chain3", "static", "dynamic"):
        gen = specmm.SpeculativeGenerator(target, ModelDrafter(drafters["perturbed"]), tree=SPECS[spec],
                                          compile=compile)
        out = gen.generate(ids, attention_mask=mask, max_new_tokens=MAX_NEW, eos_token_id=eos, pad_token_id=PAD)
        assert torch.equal(out.sequences, reference), spec
        assert sum(out.stats.accepted_histogram[1:]) > 0


def test_int32_input_ids_give_the_same_tokens():
    target, drafters, ids, mask, eos, reference = setup("llama")
    for drafter in (ModelDrafter(drafters["perturbed"]), PromptLookupDrafter(ngram=2, k=5)):
        gen = specmm.SpeculativeGenerator(target, drafter, tree=SPECS["chain3"])
        out = gen.generate(ids.int(), attention_mask=mask.int(), max_new_tokens=MAX_NEW, eos_token_id=eos,
                           pad_token_id=PAD)
        assert out.sequences.dtype == torch.long and torch.equal(out.sequences, reference)
