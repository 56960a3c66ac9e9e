"""The TRL GRPO rollout hook (no `trl` needed here): one rollout per prompt entry, in order, each row on its own seed,
exactly `StepSpeculator.generate`'s rollouts in `to_trl()` form; bad setups refused before any work."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from specmm import SamplingConfig
from specmm.reasoning import SpecReason, StepSpeculator
from specmm.reasoning.trl import ROW_SEEDS, grpo_rollout_func
from tests.reasoning.helpers import judge, models, prompts, step_ids

SAMPLING = SamplingConfig(temperature=1.0)


def speculator() -> StepSpeculator:
    tokenizer, target, draft = models()
    return StepSpeculator(target, draft, tokenizer, SpecReason(5, template=judge(tokenizer)),
                          delimiter=step_ids(tokenizer), max_step_tokens=4)


def test_each_call_and_process_gets_its_own_row_seeds_and_returns_the_speculator_rollouts():
    spec = speculator()
    group = [p for p in prompts(2) for _ in range(2)]  # TRL repeats each prompt num_generations (2) times
    rollout = grpo_rollout_func(spec, max_new_tokens=10, sampling=SAMPLING, seed=7)
    trainer = SimpleNamespace(accelerator=SimpleNamespace(process_index=1, num_processes=2))
    spec.target.train()
    outputs = [rollout(group, trainer) for _ in range(2)]
    assert spec.target.training  # the trainer's mode is restored
    for call, out in enumerate(outputs):
        first = 7 + (call * 2 + 1) * ROW_SEEDS
        direct = spec.generate(group, max_new_tokens=10, sampling=SAMPLING, seed=[first + b for b in range(4)])
        assert out == direct.to_trl()
        assert len(out["completion_ids"]) == len(out["logprobs"]) == len(out["source"]) == 4
        assert {"prompt_ids", "completion_ids", "logprobs"} <= out.keys()


def test_greedy_sampling_and_chat_prompts_are_refused():
    spec = speculator()
    with pytest.raises(ValueError, match="temperature > 0"):
        grpo_rollout_func(spec, max_new_tokens=10, sampling=SamplingConfig(temperature=0.0))
    rollout = grpo_rollout_func(spec, max_new_tokens=10, sampling=SAMPLING)
    with pytest.raises(ValueError, match="chat template"):
        rollout([[{"role": "user", "content": "hi"}]], None)
