"""SpecReason's self-judge: the target reads the candidate step through a judge prompt and scores it 0-9
from its next-token distribution over the digit tokens, in the same prefill that appends the step."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

DEFAULT_INSTRUCTION = (
    "Evaluate the last reasoning step solely based on factual correctness and logical validity. Ignore style, "
    "phrasing or overall usefulness. Assign a score from 0 to 9, where 9 is fully correct. Reply with the "
    "digit only.")
ANSWER_PREFIX = "I think the quality score is: "
SCORE_METHODS = ("greedy", "expected")


def digit_ids(tokenizer) -> list[int]:
    """Token id of each digit 0-9 (each must be a single token)."""
    ids = []
    for d in range(10):
        encoded = tokenizer.encode(str(d), add_special_tokens=False)
        if len(encoded) != 1:
            raise ValueError(f"tokenizer: digit {d} encodes to {len(encoded)} tokens; the judge reads one token")
        ids.append(encoded[0])
    return ids


@dataclass(frozen=True)
class JudgeTemplate:
    """Token ids appended after the candidate step, and the digit tokens read at the last of them."""

    suffix_ids: tuple[int, ...]
    digits: tuple[int, ...]  # token id of 0..9

    def __post_init__(self):
        if not self.suffix_ids:
            raise ValueError("suffix_ids: the judge prompt is empty")
        if len(self.digits) != 10:
            raise ValueError(f"digits: expected 10 token ids (0-9), got {len(self.digits)}")

    @classmethod
    def from_text(cls, tokenizer, suffix: str) -> JudgeTemplate:
        """A plain-text judge prompt (e.g. a judge token the target was trained on)."""
        ids = tokenizer.encode(suffix, add_special_tokens=False)
        if not ids:
            raise ValueError(f"suffix: {suffix!r} encodes to no tokens")
        return cls(tuple(ids), tuple(digit_ids(tokenizer)))

    @classmethod
    def for_chat_model(cls, tokenizer, instruction: str = DEFAULT_INSTRUCTION,
                       answer_prefix: str = ANSWER_PREFIX) -> JudgeTemplate:
        """SpecReason's layout for HF chat models: the reasoning stays an open assistant turn, then a new
        user turn asks for the score and the assistant turn starts with `answer_prefix`."""
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("tokenizer: has no chat_template; use JudgeTemplate.from_text")
        marker = "\x00SPECMM-STEP\x00"
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "q"}, {"role": "assistant", "content": marker},
             {"role": "user", "content": instruction}], tokenize=False, add_generation_prompt=True)
        if marker not in text:
            raise ValueError("tokenizer: its chat template drops assistant content; build the suffix by hand")
        return cls.from_text(tokenizer, text.split(marker, 1)[1] + answer_prefix)

    def score(self, logits: Tensor, method: str = "greedy") -> Tensor:
        """[B, V] logits at the last suffix token -> [B] scores in [0, 9].

        greedy: the argmax token's digit, 0 when it is not a digit (SpecReason's default); expected: the
        mean digit under the distribution renormalised over the digit tokens."""
        digits = torch.tensor(self.digits, device=logits.device)
        if method == "greedy":
            best = logits.argmax(-1)  # [B]
            match = best[:, None] == digits[None, :]  # [B, 10]
            return torch.where(match.any(1), match.float().argmax(1).float(), 0.0)
        if method == "expected":
            probs = logits.float()[:, digits].softmax(-1)  # [B, 10]
            return probs @ torch.arange(10, device=logits.device, dtype=torch.float32)
        raise ValueError(f"method: expected one of {SCORE_METHODS}, got {method!r}")
