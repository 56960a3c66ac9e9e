"""Step boundaries: token-id sets, string delimiters spanning tokens, budgets."""

from __future__ import annotations

import itertools

import torch

from specmm.reasoning import RandomRouting, StepDelimiter, StepSpeculator
from specmm.zoo.chainarith_task import make_tokenizer
from tests.reasoning.helpers import models, prompts


def test_string_delimiter_is_found_across_token_boundaries():
    tokenizer = make_tokenizer()
    delimiter = StepDelimiter("=4", tokenizer)  # two one-character tokens: only the tail text can see it
    ids = tokenizer.encode("A:37+5=42")
    tails = delimiter.start(1)
    ends = [bool(delimiter.ends(torch.tensor([i]), [0], tails)[0]) for i in ids]
    assert ends == [False] * 7 + [True, False]


def test_token_id_delimiter_ends_on_the_id_only():
    tokenizer = make_tokenizer()
    plus = tokenizer.convert_tokens_to_ids("+")
    delimiter = StepDelimiter([plus], tokenizer)
    ids = torch.tensor(tokenizer.encode("A:37+5+4"))
    assert delimiter.ends(ids, list(range(len(ids))), delimiter.start(len(ids))).tolist() == [
        i == plus for i in ids.tolist()]


def test_every_step_ends_at_the_delimiter_or_the_budget():
    tokenizer, target, draft = models()
    delimiter = "7"
    spec = StepSpeculator(target, draft, tokenizer, RandomRouting(0.5, seed=1), delimiter=delimiter, max_step_tokens=5)
    out = spec.generate(prompts(3), max_new_tokens=30, eos_token_id=[])
    for b, completion in enumerate(out.completions):
        spans = out.step_spans[b]
        assert spans[0][0] == 0 and spans[-1][1] == len(completion) == 30
        assert all(a[1] == b_[0] for a, b_ in itertools.pairwise(spans))  # steps tile the completion
        for start, end in spans[:-1]:
            text = tokenizer.decode(completion[start:end])
            assert text.endswith(delimiter) or end - start == 5
            assert delimiter not in tokenizer.decode(completion[start:end - 1])
