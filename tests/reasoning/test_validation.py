"""Bad input fails before any work with a ValueError that names the argument."""

from __future__ import annotations

import math

import pytest
from transformers import PreTrainedTokenizerFast

from specmm.reasoning import (
    Arbitrage,
    JudgeTemplate,
    RandomRouting,
    SpecReason,
    StepDelimiter,
    StepSpeculator,
)
from specmm.reasoning.router import RouterConfig, StepRouter
from specmm.zoo.chainarith_task import make_tokenizer
from tests.conftest import tiny_model
from tests.reasoning.helpers import judge, models, step_ids


def other_vocab_tokenizer() -> PreTrainedTokenizerFast:
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers import models as tok_models

    vocab = {c: i for i, c in enumerate(["<PAD>", "<EOS>", "x", "y", "z"])}
    core = Tokenizer(tok_models.WordLevel(vocab=vocab, unk_token="<PAD>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<PAD>", eos_token="<EOS>")


def test_tokenizers_with_different_vocabularies_are_refused():
    tokenizer, target, draft = models()
    with pytest.raises(ValueError, match="draft_tokenizer"):
        StepSpeculator(target, draft, tokenizer, draft_tokenizer=other_vocab_tokenizer(), delimiter=step_ids(tokenizer))


def test_draft_with_another_vocabulary_size_is_refused():
    tokenizer, target, _ = models()
    wider = tiny_model("llama", seed=2, vocab=len(tokenizer) + 8, num_hidden_layers=1)
    with pytest.raises(ValueError, match="draft: vocabulary size"):
        StepSpeculator(target, wider, tokenizer, RandomRouting(0.5), delimiter=step_ids(tokenizer))


def test_delimiter_that_encodes_to_nothing_is_refused():
    tokenizer = make_tokenizer()
    with pytest.raises(ValueError, match="delimiter"):
        StepDelimiter("", tokenizer)
    with pytest.raises(ValueError, match="delimiter"):
        StepDelimiter([], tokenizer)
    with pytest.raises(ValueError, match="delimiter"):
        StepDelimiter([10_000], tokenizer)
    with pytest.raises(ValueError, match="max_step_tokens"):
        StepDelimiter([3], tokenizer, max_step_tokens=0)


@pytest.mark.parametrize("threshold", [-1, 9.5, 10, math.nan, "7"])
def test_specreason_threshold_outside_the_judge_scale_is_refused(threshold):
    with pytest.raises(ValueError, match="threshold"):
        SpecReason(threshold, template=judge(make_tokenizer()))


@pytest.mark.parametrize("threshold", [-0.1, 1.5])
def test_router_and_random_thresholds_outside_0_1_are_refused(threshold):
    router = StepRouter(RouterConfig(hidden_size=32))
    with pytest.raises(ValueError, match="threshold"):
        Arbitrage(router, threshold)
    with pytest.raises(ValueError, match="threshold"):
        RandomRouting(threshold)


def test_router_trained_on_another_draft_is_refused():
    tokenizer, target, draft = models()
    with pytest.raises(ValueError, match="router"):
        StepSpeculator(target, draft, tokenizer, Arbitrage(StepRouter(RouterConfig(hidden_size=7))),
                       delimiter=step_ids(tokenizer))


def test_judge_template_needs_single_token_digits_and_a_prompt():
    with pytest.raises(ValueError, match="suffix"):
        JudgeTemplate.from_text(make_tokenizer(), "")
    with pytest.raises(ValueError, match="chat_template"):
        JudgeTemplate.for_chat_model(make_tokenizer())


def test_generate_arguments_are_checked():
    tokenizer, target, draft = models()
    spec = StepSpeculator(target, draft, tokenizer, RandomRouting(0.5), delimiter=step_ids(tokenizer))
    cases = [({"prompts": []}, "prompts"), ({"prompts": [[1, 999]]}, "prompts"),
             ({"prompts": ["<BOS>1"], "max_new_tokens": 0}, "max_new_tokens"),
             ({"prompts": ["<BOS>1"], "sampling": 0.5}, "sampling"),
             ({"prompts": ["<BOS>1", "<BOS>2"], "seed": [1]}, "seed"),
             ({"prompts": ["<BOS>1"], "eos_token_id": 999}, "eos_token_id"),
             ({"prompts": ["<BOS>1"], "eos_token_id": True}, "eos_token_id"),
             ({"prompts": ["<BOS>1"], "pad_token_id": -1}, "pad_token_id"),
             ({"prompts": ["<BOS>1"], "seed": 1.5}, "seed"), ({"prompts": ["<BOS>1"], "seed": True}, "seed"),
             ({"prompts": ["<BOS>1"], "max_steps": True}, "max_steps")]
    cases += [({"prompts": ["<BOS>1"], "schedule": "eager"}, "schedule"),
              ({"prompts": ["<BOS>1"], "batch_size": 0}, "batch_size"),
              ({"prompts": ["<BOS>1"], "refill": True}, "refill"),  # lockstep batches do not refill
              ({"prompts": ["<BOS>1"], "schedule": "async", "refill": 1}, "refill")]
    for kwargs, name in cases:
        with pytest.raises(ValueError, match=name):
            spec.generate(**kwargs)


def test_async_schedule_needs_the_judge_suffix_of_a_judging_policy():
    from specmm.reasoning import StepPolicy

    class Unnamed(StepPolicy):  # judges through view.judge without naming its suffix
        judges = True

    tokenizer, target, draft = models()
    spec = StepSpeculator(target, draft, tokenizer, Unnamed(), delimiter=step_ids(tokenizer))
    with pytest.raises(ValueError, match="judge_suffix"):
        spec.generate(["<BOS>1"], schedule="async")


@pytest.mark.parametrize(("broken_role", "schedule"), [("target", "lockstep"), ("draft", "lockstep"),
                                                      ("draft", "async")])
def test_nan_weights_raise_naming_the_model_and_the_token(broken_role, schedule):
    import copy

    import torch

    from specmm.core.finite import NonFiniteError

    tokenizer, target, draft = models()
    target, draft = copy.deepcopy(target), copy.deepcopy(draft)
    with torch.no_grad():
        (target if broken_role == "target" else draft).get_output_embeddings().weight.fill_(float("nan"))
    policy = SpecReason(7, template=judge(tokenizer))
    spec = StepSpeculator(target, draft, tokenizer, policy, delimiter=step_ids(tokenizer), max_step_tokens=4)
    with pytest.raises(NonFiniteError, match=r"LlamaForCausalLM: non-finite logits \(NaN or inf\) at token 0 of a "
                                             r"reasoning step \(rows \[0, 1\]\)"):
        spec.generate(["1+2=", "3*4="], max_new_tokens=8, schedule=schedule)
