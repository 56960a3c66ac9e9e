"""The SpecReason judge: digit scoring and chat-model templates built from the tokenizer's own template."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from specmm.reasoning import JudgeTemplate, SpecReason, StepSpeculator
from specmm.zoo.chainarith_task import make_tokenizer
from tests.conftest import tiny_model

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
PLAIN = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
         "{% if add_generation_prompt %}assistant: {% endif %}")


def chat_tokenizer() -> PreTrainedTokenizerFast:
    words = ["<unk>", "<|im_start|>", "<|im_end|>", "\n", ":", " "] + [str(d) for d in range(10)] + list(
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.,-")
    core = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>",
                                        additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    tokenizer.chat_template = CHATML
    return tokenizer


def test_chat_template_suffix_closes_the_step_turn_and_opens_the_judge_answer():
    tokenizer = chat_tokenizer()
    template = JudgeTemplate.for_chat_model(tokenizer, instruction="Score it.", answer_prefix="Score: ")
    text = tokenizer.decode(list(template.suffix_ids))
    assert text.replace(" ", "") == "<|im_end|>\n<|im_start|>user\nScoreit.<|im_end|>\n<|im_start|>assistant\nScore:"
    assert [tokenizer.decode([d]) for d in template.digits] == [str(d) for d in range(10)]


def test_greedy_score_is_the_argmax_digit_and_zero_for_non_digits():
    tokenizer = make_tokenizer()
    template = JudgeTemplate.from_text(tokenizer, "<JUDGE>")
    logits = torch.full((3, len(tokenizer)), -5.0)
    logits[0, template.digits[7]] = 3.0
    logits[1, tokenizer.convert_tokens_to_ids("+")] = 4.0  # a non-digit wins: reject (score 0)
    logits[1, template.digits[9]] = 3.0
    logits[2, template.digits[2]] = 1.0
    assert template.score(logits, "greedy").tolist() == [7.0, 0.0, 2.0]


def test_expected_score_renormalises_over_digits():
    tokenizer = make_tokenizer()
    template = JudgeTemplate.from_text(tokenizer, "<JUDGE>")
    logits = torch.full((1, len(tokenizer)), -1e4)
    logits[0, tokenizer.convert_tokens_to_ids("+")] = 50.0  # non-digit mass is ignored
    logits[0, template.digits[0]] = 0.0
    logits[0, template.digits[9]] = 0.0
    torch.testing.assert_close(template.score(logits, "expected"), torch.tensor([4.5]))


def test_a_policy_shared_by_two_speculators_judges_with_the_chat_template_of_the_one_generating():
    chatml, plain = chat_tokenizer(), chat_tokenizer()
    plain.chat_template = PLAIN
    target = tiny_model(vocab=len(chatml), seed=0, logit_scale=3.0)
    draft = tiny_model(vocab=len(chatml), seed=1, num_hidden_layers=1, logit_scale=3.0)
    options = dict(delimiter=[chatml.convert_tokens_to_ids("\n")], max_step_tokens=5)
    shared = SpecReason(5, method="expected")  # expected scores move with every token of the judge suffix
    speculators = {name: StepSpeculator(target, draft, tok, shared, **options)
                   for name, tok in (("chatml", chatml), ("plain", plain))}
    assert JudgeTemplate.for_chat_model(chatml).suffix_ids != JudgeTemplate.for_chat_model(plain).suffix_ids
    for name, tokenizer in (("chatml", chatml), ("plain", plain), ("chatml", chatml)):
        out = speculators[name].generate(["abc", "xyz"], max_new_tokens=15)
        own = StepSpeculator(target, draft, tokenizer, SpecReason(5, method="expected"), **options).generate(
            ["abc", "xyz"], max_new_tokens=15)
        assert shared.template.suffix_ids == JudgeTemplate.for_chat_model(tokenizer).suffix_ids
        assert len(out.scores) == len(own.scores) and torch.equal(out.completion_ids, own.completion_ids)
        for row, own_row in zip(out.scores, own.scores):
            torch.testing.assert_close(torch.tensor(row), torch.tensor(own_row), rtol=0, atol=0, equal_nan=True)
