"""The SpecReason judge: digit scoring and chat-model templates built from the tokenizer's own template."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from specmm.reasoning import JudgeTemplate
from specmm.zoo.chainarith_task import make_tokenizer

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


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
