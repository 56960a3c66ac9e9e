"""ChainArith: multi-step arithmetic mod 100 with an exact checker for every step and for the answer.

Prompt `<BOS>37 A+5 B*7 C+3?`, solution one step per op, `A:37+5=42<STEP>B:42*7=94<STEP>C:94+3=97<STEP>`,
then `<ANS>97<EOS>`. Additions of one digit are easy; products mod 100 (carry into the tens digit) are
hard, so a weak draft fails mostly on identifiable steps. One character is one token.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, STEP, ANS, JUDGE = "<PAD>", "<BOS>", "<EOS>", "<STEP>", "<ANS>", "<JUDGE>"
SPECIALS = [PAD, BOS, EOS, STEP, ANS, JUDGE]
LETTERS = "ABCDEFGHIJ"
CHARS = "0123456789+*=:? " + LETTERS
GOOD, BAD = "9", "0"  # judge digits for a valid and an invalid step


def make_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level HF fast tokenizer with the task's special tokens (ids 0-5)."""
    vocab = {t: i for i, t in enumerate(SPECIALS + list(CHARS))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, bos_token=BOS, eos_token=EOS, pad_token=PAD,
                                        additional_special_tokens=[STEP, ANS, JUDGE], model_max_length=4096)
    tokenizer.padding_side = "left"
    return tokenizer


@dataclass(frozen=True)
class Problem:
    start: int
    ops: tuple[tuple[str, int], ...]  # ('+', 1..9) or ('*', 2..9)

    @property
    def prompt(self) -> str:
        return BOS + f"{self.start:02d}" + "".join(f" {LETTERS[i]}{op}{d}" for i, (op, d) in enumerate(self.ops)) + "?"

    def values(self) -> list[int]:
        out = [self.start]
        for op, d in self.ops:
            out.append(apply(out[-1], op, d))
        return out

    @property
    def answer(self) -> int:
        return self.values()[-1]

    def steps(self) -> list[str]:
        """The correct solution, one string per step (the answer step last)."""
        values = self.values()
        lines = [step_text(i, values[i], op, d) for i, (op, d) in enumerate(self.ops)]
        return lines + [f"{ANS}{values[-1]:02d}{EOS}"]


def apply(value: int, op: str, digit: int) -> int:
    return (value + digit) % 100 if op == "+" else (value * digit) % 100


def step_text(index: int, value: int, op: str, digit: int) -> str:
    return f"{LETTERS[index]}:{value:02d}{op}{digit}={apply(value, op, digit):02d}{STEP}"


def sample_problem(rng: random.Random, min_ops: int = 3, max_ops: int = 6, hard_share: float = 0.5) -> Problem:
    ops = []
    for _ in range(rng.randint(min_ops, max_ops)):
        ops.append(("*", rng.randint(2, 9)) if rng.random() < hard_share else ("+", rng.randint(1, 9)))
    return Problem(rng.randint(0, 99), tuple(ops))


_OP = re.compile(r" ([A-J])([+*])(\d)")
_RESULT = re.compile(r"=(\d\d)" + re.escape(STEP))


def parse_prompt(text: str) -> Problem | None:
    """The problem stated at the start of a context (None if it is not a ChainArith prompt)."""
    head = text.split("?", 1)[0]
    match = re.match(re.escape(BOS) + r"(\d\d)((?: [A-J][+*]\d)*)$", head)
    if match is None:
        return None
    return Problem(int(match.group(1)), tuple((op, int(d)) for _, op, d in _OP.findall(match.group(2))))


def expected_step(context: str) -> str | None:
    """The valid next step after `context` (prompt + steps so far), checking each step against the value
    the previous step wrote (local validity), or None when the context is not a ChainArith solution."""
    problem = parse_prompt(context)
    if problem is None:
        return None
    done = context.split("?", 1)[1]
    written = _RESULT.findall(done)
    index = done.count(STEP)
    value = int(written[-1]) if written else problem.start
    if index < len(problem.ops):
        op, digit = problem.ops[index]
        return step_text(index, value, op, digit)
    return f"{ANS}{value:02d}{EOS}"


def is_hard(context: str) -> bool:
    """Is the next step a product?"""
    problem = parse_prompt(context)
    index = context.split("?", 1)[1].count(STEP) if problem else 0
    return bool(problem) and index < len(problem.ops) and problem.ops[index][0] == "*"


def answer_of(completion: str) -> int | None:
    match = re.search(re.escape(ANS) + r"(\d\d)" + re.escape(EOS), completion)
    return int(match.group(1)) if match else None


def corrupt(step: str, rng: random.Random) -> str:
    """A plausible wrong version of a valid step: a wrong result digit (mostly) or a wrong copied operand."""
    if step.startswith(ANS):
        value = int(step[len(ANS):len(ANS) + 2])
        return f"{ANS}{(value + rng.randint(1, 99)) % 100:02d}{EOS}"
    head, result = step[:-len(STEP)].rsplit("=", 1)
    if rng.random() < 0.8:
        digits = list(result)
        pos = rng.randrange(2)
        digits[pos] = str((int(digits[pos]) + rng.randint(1, 9)) % 10)
        return f"{head}={''.join(digits)}{STEP}"
    operand = int(head[2:4])
    wrong = (operand + rng.randint(1, 99)) % 100
    return f"{head[:2]}{wrong:02d}{head[4:]}={result}{STEP}"


class StepChecker:
    """Exact step scorer for OracleRouting / reports: 1.0 for a locally valid step, else 0.0."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def __call__(self, contexts: list[list[int]], steps: list[list[int]]) -> list[float]:
        scores = []
        for context, step in zip(contexts, steps):
            expected = expected_step(self.tokenizer.decode(context))
            scores.append(float(expected is not None and self.tokenizer.decode(step) == expected))
        return scores
