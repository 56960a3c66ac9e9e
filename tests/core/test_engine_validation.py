"""Bad input gets a ValueError naming the argument, before any model forward runs."""

from __future__ import annotations

import pytest
import torch

import specmm
from specmm.drafters import ModelDrafter, PromptLookupDrafter
from tests.conftest import left_padded_batch, tiny_model


@pytest.fixture
def counted():
    """(target, draft, forwards): every forward of either model is recorded in `forwards`."""
    target, draft = tiny_model("llama"), tiny_model("llama", seed=1)
    forwards = []
    for model in (target, draft):
        model.register_forward_pre_hook(lambda *args: forwards.append(1))
    yield target, draft, forwards
    assert forwards == [], "a forward ran before the error"


def make(target, draft, **kw):
    return specmm.SpeculativeGenerator(target, ModelDrafter(draft), **kw)


def test_vocabulary_mismatch_is_refused(counted):
    target, _, _ = counted
    with pytest.raises(ValueError, match="drafter: vocabulary size 50"):
        make(target, tiny_model("llama", vocab=50))


def test_draft_on_another_device_is_refused(counted):
    target, _, _ = counted
    with pytest.raises(ValueError, match="drafter: on meta"):
        make(target, tiny_model("llama").to("meta"))


@pytest.mark.parametrize("kwargs, argument", [
    ({"temperature": -0.5}, "temperature"),
    ({"temperature": float("nan")}, "temperature"),
    ({"temperature": float("inf")}, "temperature"),
    ({"top_p": float("nan")}, "top_p"),
    ({"top_p": float("inf")}, "top_p"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": -1}, "top_k"),
    ({"top_k": 2.5}, "top_k"),
])
def test_bad_sampling_values_are_refused(kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        specmm.SamplingConfig(**kwargs)


@pytest.mark.parametrize("call, argument", [
    (lambda ids, mask: dict(input_ids=ids, max_new_tokens=0), "max_new_tokens"),
    (lambda ids, mask: dict(input_ids=ids, max_new_tokens=2.0), "max_new_tokens"),
    (lambda ids, mask: dict(input_ids=ids[:, :0]), "input_ids: empty"),
    (lambda ids, mask: dict(input_ids=ids[:0]), "input_ids: empty"),
    (lambda ids, mask: dict(input_ids=ids[0]), "input_ids"),
    (lambda ids, mask: dict(input_ids=ids + 1000), "input_ids: token ids"),
    (lambda ids, mask: dict(input_ids=ids, attention_mask=mask[:, 1:]), "attention_mask: shape"),
    (lambda ids, mask: dict(input_ids=ids, attention_mask=mask.flip(1)), "attention_mask: the last column"),
    (lambda ids, mask: dict(input_ids=ids, eos_token_id=10_000), "eos_token_id"),
    (lambda ids, mask: dict(input_ids=ids, pad_token_id=96), "pad_token_id"),
    (lambda ids, mask: dict(input_ids=ids, pad_token_id=-1), "pad_token_id"),
    (lambda ids, mask: dict(input_ids=ids, generator=[torch.Generator()]), "generator"),
    (lambda ids, mask: dict(input_ids=ids, sampling="greedy"), "sampling"),
    (lambda ids, mask: dict(input_ids=ids, streamer=object()), "streamer"),
])
def test_bad_generate_arguments_are_refused_before_any_forward(counted, call, argument):
    target, draft, _ = counted
    ids, mask = left_padded_batch([3, 5], seed=0)
    with pytest.raises(ValueError, match=argument):
        make(target, draft).generate(**{"attention_mask": mask, **call(ids, mask)})


def test_bad_acceptance_and_tree_arguments_are_refused(counted):
    target, draft, _ = counted
    with pytest.raises(ValueError, match="acceptance"):
        make(target, draft, acceptance="lenient")
    with pytest.raises(ValueError, match="tree"):
        make(target, draft, tree=[[0], [1]])
    with pytest.raises(ValueError, match="tree: PromptLookupDrafter"):
        specmm.SpeculativeGenerator(target, PromptLookupDrafter(), tree=specmm.TreeSpec.static([[0], [1]]))
    ids, _ = left_padded_batch([3], seed=0)
    with pytest.raises(ValueError, match="acceptance: 'greedy' needs sampling temperature 0"):
        make(target, draft, acceptance="greedy").generate(ids, sampling=specmm.SamplingConfig(temperature=1.0))


@pytest.mark.parametrize("build, message", [
    (lambda: specmm.TreeSpec.chain(0), "k must be"),
    (lambda: specmm.TreeSpec.static([]), "at least one path"),
    (lambda: specmm.TreeSpec.static([[0, 1]]), "needs its parent"),
    (lambda: specmm.TreeSpec.static([[-1]]), "ranks >= 0"),
    (lambda: specmm.TreeSpec.dynamic(depth=2, top_k=2, total_tokens=100), "total_tokens must be in"),
    (lambda: specmm.TreeSpec.dynamic(depth=0), "depth"),
])
def test_bad_tree_specs_are_refused(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_flash_attention_targets_are_refused():
    target = tiny_model("llama")
    target.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="attn_implementation"):
        specmm.SpeculativeGenerator(target, PromptLookupDrafter())


def test_generation_config_pad_outside_the_vocabulary_is_refused(counted):
    target, draft, _ = counted
    target.generation_config.pad_token_id = 96
    ids, mask = left_padded_batch([3, 5], seed=0)
    with pytest.raises(ValueError, match=r"pad_token_id: expected an id in \[0, 96\).*generation_config"):
        make(target, draft).generate(ids, attention_mask=mask)


@pytest.mark.parametrize("tree, message", [
    (specmm.TreeSpec.dynamic(depth=2, top_k=96, total_tokens=10), "tree: top_k=96 must be smaller"),
    (specmm.TreeSpec.static([[0], [96]]), "tree: static choice rank 96 must be smaller"),
])
def test_tree_wider_than_the_vocabulary_is_refused(counted, tree, message):
    target, draft, _ = counted
    with pytest.raises(ValueError, match=message):
        make(target, draft, tree=tree)
