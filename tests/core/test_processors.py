"""generation_config is honoured: EOS/pad ids, and logits processors at every tree node equal HF's own.

Greedy cases compare token for token with `model.generate(do_sample=False)` reading the same generation
config, on a ragged left-padded batch; the node-level case applies HF's processor classes to each node's
explicit sequence; the sampling case checks the joint law of three tokens with a chi-square test.
"""

from __future__ import annotations

import functools

import pytest
import torch
from transformers import (
    InfNanRemoveLogitsProcessor,
    LogitNormalization,
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SuppressTokensAtBeginLogitsProcessor,
    SuppressTokensLogitsProcessor,
)

import specmm
from specmm.core.processors import History, TreeLogitsProcessor, hf_skips_left_padding
from specmm.core.tree import grow_tree
from specmm.drafters import ModelDrafter, PromptLookupDrafter
from tests.conftest import left_padded_batch, perturbed_copy, tiny_model
from tests.core.test_engine_sampling import PROMPT, SAMPLES, VOCAB as SMALL_VOCAB, assert_matches, speculative_counts

PROMPT_LENGTHS = [5, 11, 3, 8]
MAX_NEW = 24
PAD = 0


@functools.cache
def plain():
    """(input_ids, attention_mask, free greedy continuation of the unprocessed target, eos token)."""
    ids, mask = left_padded_batch(PROMPT_LENGTHS, seed=1)
    free = tiny_model("llama").generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW,
                                        pad_token_id=PAD)
    new = free[:, ids.shape[1]:]
    early = [set(r[:6].tolist()) for r in new]
    eos = next(t for t in sorted(set().union(*early)) if t != PAD and sum(t in set(r.tolist()) for r in new) < 4)
    return ids, mask, free, eos


def settings() -> dict[str, dict]:
    _, _, free, eos = plain()
    new = free[:, free.shape[1] - MAX_NEW:]
    frequent = torch.bincount(new.flatten()).topk(3).indices.tolist()
    return {
        "repetition_penalty": {"repetition_penalty": 1.5},
        "repetition_reward": {"repetition_penalty": 0.7},
        "no_repeat_ngram_2": {"no_repeat_ngram_size": 2},
        "no_repeat_ngram_3": {"no_repeat_ngram_size": 3},
        "suppress_tokens": {"suppress_tokens": frequent},
        "begin_suppress_tokens": {"begin_suppress_tokens": sorted(set(new[:, 0].tolist()))},
        "min_new_tokens": {"eos_token_id": eos, "min_new_tokens": 16},
        "all": {"eos_token_id": [eos, frequent[0]], "min_new_tokens": 6, "repetition_penalty": 1.3,
                "no_repeat_ngram_size": 3, "suppress_tokens": frequent[1:2], "begin_suppress_tokens": frequent[2:]},
    }


def configured(arch: str = "llama", **generation_config):
    target = tiny_model(arch)
    for name, value in generation_config.items():
        setattr(target.generation_config, name, value)
    return target


@functools.cache
def reference(name: str) -> torch.Tensor:
    ids, mask, _, _ = plain()
    target = configured(**settings()[name])
    return target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW, pad_token_id=PAD)


DRAFTS = {
    "chain3": (lambda t: ModelDrafter(perturbed_copy(t, 0.3)), specmm.TreeSpec.chain(3)),
    "dynamic": (lambda t: ModelDrafter(perturbed_copy(t, 0.3)),
                specmm.TreeSpec.dynamic(depth=4, top_k=3, total_tokens=14)),
    "prompt-lookup": (lambda t: PromptLookupDrafter(ngram=2, k=5), specmm.TreeSpec.chain(5)),
}


@pytest.mark.parametrize("draft_name", list(DRAFTS))
@pytest.mark.parametrize("name", ["repetition_penalty", "repetition_reward", "no_repeat_ngram_2", "no_repeat_ngram_3",
                                  "suppress_tokens", "begin_suppress_tokens", "min_new_tokens", "all"])
def test_generation_config_processors_greedy_equal_generate(name, draft_name):
    ids, mask, free, _ = plain()
    expected = reference(name)
    assert not torch.equal(expected, free), f"{name} must change the greedy output for the test to mean anything"
    target = configured(**settings()[name])
    make_drafter, spec = DRAFTS[draft_name]
    out = specmm.SpeculativeGenerator(target, make_drafter(target), tree=spec).generate(
        ids, attention_mask=mask, max_new_tokens=MAX_NEW)
    assert torch.equal(out.sequences, expected)
    if draft_name != "prompt-lookup":
        assert sum(out.stats.accepted_histogram[1:]) > 0, "some drafts must be accepted"


def test_generation_config_eos_and_pad_are_used_when_not_passed():
    ids, mask, free, eos = plain()
    other = int(free[0, -1])
    target = configured(eos_token_id=[eos, other], pad_token_id=PAD)
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW)
    stopped = [bool(torch.isin(row[ids.shape[1]:], torch.tensor([eos, other])).any()) for row in expected]
    assert any(stopped) and not all(stopped)
    out = specmm.SpeculativeGenerator(target, ModelDrafter(perturbed_copy(target, 0.3))).generate(
        ids, attention_mask=mask, max_new_tokens=MAX_NEW)
    assert torch.equal(out.sequences, expected)
    target.generation_config.eos_token_id = eos  # a single int works too; the argument still wins over it
    passed = specmm.SpeculativeGenerator(target, ModelDrafter(target)).generate(
        ids, attention_mask=mask, max_new_tokens=MAX_NEW, eos_token_id=other)
    assert torch.equal(passed.sequences,
                       target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW,
                                       eos_token_id=other))
    no_eos = specmm.SpeculativeGenerator(target, ModelDrafter(target)).generate(
        ids, attention_mask=mask, max_new_tokens=MAX_NEW, eos_token_id=[])  # [] turns the config's EOS off
    assert torch.equal(no_eos.sequences, free)


NODE_CASES = {  # generation_config settings -> HF's processors for them (prompt width, ignored columns, eos)
    "penalty-ngram2-min_new-suppress": (
        dict(repetition_penalty=1.7, no_repeat_ngram_size=2, min_new_tokens=5, suppress_tokens=[3, 4],
             begin_suppress_tokens=[5, 6]),
        lambda width, ignore, eos: [
            RepetitionPenaltyLogitsProcessor(1.7, prompt_ignore_length=ignore), NoRepeatNGramLogitsProcessor(2),
            MinNewTokensLengthLogitsProcessor(width, 5, eos), SuppressTokensLogitsProcessor([3, 4]),
            SuppressTokensAtBeginLogitsProcessor([5, 6], width)]),
    "reward-ngram3-min_length-invalid-renormalize": (
        dict(repetition_penalty=0.8, no_repeat_ngram_size=3, min_length=13, remove_invalid_values=True,
             renormalize_logits=True),
        lambda width, ignore, eos: [
            RepetitionPenaltyLogitsProcessor(0.8, prompt_ignore_length=ignore), NoRepeatNGramLogitsProcessor(3),
            MinLengthLogitsProcessor(13, eos), InfNanRemoveLogitsProcessor(), LogitNormalization()]),
}


@pytest.mark.parametrize("case", list(NODE_CASES))
def test_every_tree_node_is_processed_like_hf_after_its_own_sequence(case):
    """Node by node: the processed logits equal HF's processor classes run on the node's explicit sequence."""
    settings_, hf_processors = NODE_CASES[case]
    vocab, eos = 40, 7
    target = tiny_model("llama", vocab=vocab)
    for name, value in settings_.items():
        setattr(target.generation_config, name, value)
    processor = TreeLogitsProcessor.from_model(target, [eos])
    gen = torch.Generator().manual_seed(0)
    prompt, prompt_mask = left_padded_batch([6, 3, 5], vocab=vocab, seed=2)
    prompt[:, -3:] = torch.tensor([[9, 10, 9], [9, 10, 9], [1, 2, 1]])  # repeated n-grams to ban
    counts = torch.tensor([0, 3, 1])
    new_tokens = torch.randint(0, 12, (3, 8), generator=gen)  # few distinct tokens: n-grams repeat
    history = History.of(prompt, prompt_mask, new_tokens, counts, torch.arange(3))
    roots = history.tokens.gather(1, (history.lengths - 1)[:, None])[:, 0]
    spec = specmm.TreeSpec.dynamic(depth=4, top_k=3, total_tokens=16)
    tree = grow_tree(spec, roots, torch.randn(3, vocab, generator=gen),
                     lambda tokens, parents: torch.randn(*tokens.shape, vocab, generator=gen) * 3,
                     specmm.SamplingConfig(0.0))
    logits = torch.randn(3, tree.num_nodes, vocab, generator=gen, dtype=torch.float64)
    logits[0, 1, 0], logits[1, 2, 1] = torch.inf, -torch.inf
    processed = processor(logits, tree, history)

    width, changed = prompt.shape[1], 0
    for b in range(3):
        ignore = history.pad_before[b:b + 1] if hf_skips_left_padding() else None  # what this HF's generate passes
        hf = hf_processors(width, ignore, eos)
        for node in range(tree.num_nodes):
            path = tree.path_to(torch.tensor([node]).expand(3))[b, 1: int(tree.depth[b, node]) + 1]
            sequence = torch.cat([history.tokens[b, : history.lengths[b]], tree.tokens[b, path]])[None]
            scores = logits[b, node].float()[None]
            for p in hf:
                scores = p(sequence, scores)
            assert torch.equal(processed[b, node], scores[0]), f"row {b}, node {node}"
            changed += int((scores[0] < -1e30).sum())  # banned: -inf, or the float32 minimum after remove_invalid
    assert changed > 0, "some tokens must be banned for the comparison to mean anything"


@functools.cache
def sampling_models():
    target = tiny_model("llama", vocab=SMALL_VOCAB, logit_scale=15.0)
    target.generation_config.repetition_penalty = 3.0  # strong enough to move mass the test can see
    target.generation_config.no_repeat_ngram_size = 2
    return target, perturbed_copy(target, 0.6)


def exact_joint_processed(model, sampling) -> torch.Tensor:
    """[V, V, V] law of three tokens after PROMPT under HF's processors, then specmm's warpers."""
    hf = [RepetitionPenaltyLogitsProcessor(3.0), NoRepeatNGramLogitsProcessor(2)]
    vocab = SMALL_VOCAB

    def step(prefixes: torch.Tensor) -> torch.Tensor:
        sequences = torch.cat([PROMPT.expand(prefixes.shape[0], -1), prefixes], 1)
        with torch.no_grad():
            scores = model(sequences).logits[:, -1].float()
        for p in hf:
            scores = p(sequences, scores)
        return specmm.core.sampling.process_logits(scores, sampling)

    first = step(torch.zeros(1, 0, dtype=torch.long))[0]
    second = step(torch.arange(vocab)[:, None])
    third = step(torch.cartesian_prod(torch.arange(vocab), torch.arange(vocab)))
    return (first[:, None, None] * second[:, :, None] * third.view(vocab, vocab, vocab)).double()


@pytest.mark.parametrize("tree", [specmm.TreeSpec.chain(2), specmm.TreeSpec.dynamic(depth=3, top_k=2, total_tokens=8)],
                         ids=["chain-sampled", "dynamic-deterministic"])
def test_sampled_joint_distribution_with_processors_matches_processed_target(tree, monkeypatch):
    target, draft = sampling_models()
    sampling = specmm.SamplingConfig(temperature=0.7)
    monkeypatch.setattr("tests.core.test_engine_sampling.models", lambda: (target, draft))
    counts, stats = speculative_counts(ModelDrafter(draft), tree, sampling, seed=5)
    assert counts.sum() == SAMPLES
    assert stats.accepted_histogram[0] > 0 and sum(stats.accepted_histogram[1:]) > 0
    assert_matches(counts, exact_joint_processed(target, sampling))


@pytest.mark.parametrize("name, value", [
    ("bad_words_ids", [[5]]), ("sequence_bias", {(5,): 1.0}), ("guidance_scale", 1.5),
    ("encoder_repetition_penalty", 1.2), ("encoder_no_repeat_ngram_size", 2), ("forced_bos_token_id", 1),
    ("forced_eos_token_id", 2), ("exponential_decay_length_penalty", (4, 1.1)), ("num_beams", 3),
    ("stop_strings", ["stop"]), ("dola_layers", "high"), ("num_return_sequences", 2),
])
def test_unsupported_generation_config_settings_are_refused_before_any_forward(name, value):
    target = tiny_model("llama")
    setattr(target.generation_config, name, value)
    forwards = []
    target.register_forward_pre_hook(lambda *args: forwards.append(1))
    ids, mask = left_padded_batch([3, 5], seed=0)
    with pytest.raises(ValueError, match=f"generation_config.{name}="):
        specmm.SpeculativeGenerator(target, PromptLookupDrafter()).generate(ids, attention_mask=mask)
    assert forwards == []


def test_sampling_config_from_generation_config():
    target = tiny_model("llama")
    config = target.generation_config
    assert specmm.SamplingConfig.from_generation_config(config).greedy
    config.do_sample, config.temperature, config.top_k, config.top_p = True, 0.7, 20, 0.8
    assert specmm.SamplingConfig.from_generation_config(config) == specmm.SamplingConfig(0.7, 20, 0.8)
    config.min_p = 0.1
    with pytest.raises(ValueError, match="generation_config.min_p"):
        specmm.SamplingConfig.from_generation_config(config)


def test_no_processor_when_the_generation_config_sets_none():
    assert TreeLogitsProcessor.from_model(tiny_model("llama"), [3]) is None


@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
def test_drafts_follow_the_processors_so_a_draft_equal_to_the_target_is_always_accepted(compile):
    """With the target's processors applied to draft logits, a draft model equal to the target proposes exactly the
    processed greedy tokens: every round of a chain accepts every draft. Unprocessed, the rules reject some."""
    ids, mask, _, _ = plain()
    expected = reference("all")
    target = configured(**settings()["all"])
    accepted = {}
    for processed in (True, False):
        drafter = ModelDrafter(configured(**settings()["all"]))  # the target's weights
        if not processed:
            drafter.processes_drafts = False  # the engine then drafts without the processors
        gen = specmm.SpeculativeGenerator(target, drafter, tree=specmm.TreeSpec.chain(3),
                                          compile=compile and processed)  # the unprocessed reference: eager
        out = gen.generate(ids, attention_mask=mask, max_new_tokens=MAX_NEW)
        assert torch.equal(out.sequences, expected)
        accepted[processed] = out.stats.mean_accepted
    assert accepted[True] == pytest.approx(4.0, abs=0.3)  # only rounds cut by the token budget take fewer
    assert accepted[False] < accepted[True] - 0.5


@pytest.mark.parametrize("spec", [specmm.TreeSpec.chain(3), specmm.TreeSpec.dynamic(depth=3, top_k=2, total_tokens=7),
                                  specmm.TreeSpec.static([[0], [1], [0, 0], [0, 1], [0, 0, 0]])],
                         ids=["chain", "dynamic", "static"])
@pytest.mark.parametrize("drafter_kind", ["model", "eagle"])
def test_drafters_pick_from_processed_logits_given_each_nodes_path(drafter_kind, spec, monkeypatch):
    """The engine hands the drafter its nodes' paths and the drafter picks tokens from what `process` returns: a
    processor allowing only token d + 1 after a path of d tokens makes every tree hold the path 1, 2, 3."""
    from specmm.core.eagle import EagleDrafter

    paths_seen = []

    def only_next(self, logits, paths, history):
        paths_seen.append(paths.clone())
        allowed = torch.full(logits.shape, -torch.inf)
        allowed[..., paths.shape[2] + 1] = 0.0
        return allowed

    monkeypatch.setattr(TreeLogitsProcessor, "process_paths", only_next)
    ids, mask, _, _ = plain()
    target = configured(**settings()["no_repeat_ngram_2"])
    torch.manual_seed(0)
    drafter = (ModelDrafter(perturbed_copy(target, 0.3)) if drafter_kind == "model"
               else EagleDrafter(EagleDrafter.for_target(target).head, target))
    trees, draft = [], drafter.draft
    drafter.draft = lambda *args, **kwargs: trees.append(draft(*args, **kwargs)) or trees[-1]
    out = specmm.SpeculativeGenerator(target, drafter, tree=spec).generate(ids, attention_mask=mask,
                                                                           max_new_tokens=MAX_NEW)
    assert torch.equal(out.sequences, reference("no_repeat_ngram_2"))  # what the drafts are never changes that
    assert trees and {p.shape[2] for p in paths_seen} == {0, 1, 2}
    for tree in trees:
        for depth in (1, 2, 3):
            assert ((tree.tokens == depth) & (tree.depth == depth)).any(1).all()
    if spec.kind != "dynamic":  # the best path of a dynamic tree's frontier is one of its k
        assert all(torch.equal(p, torch.arange(1, p.shape[2] + 1).expand_as(p)) for p in paths_seen)
