"""A TRL `GRPOTrainer` rollout hook backed by specmm's step-level or token-level speculation; run against trl 1.16.0
in `tests/reasoning/test_trl_grpo.py` (2 GRPO steps on tiny models, CPU, no vLLM).

TRL's contract (`GRPOTrainer(..., rollout_func=f)`; experimental in TRL, silence its warning with
`TRL_EXPERIMENTAL_SILENCE=1`):
- `f(prompts, trainer)` gets this process's slice of the batch's dataset prompts, as the dataset holds them.
  TRL's sampler has already repeated each prompt `num_generations` times, in consecutive groups (TRL's own
  docstring says "no duplication"; 1.16.0's code passes the repeated entries), so every entry is one rollout:
  `f` returns exactly one completion per entry, in order. It is called in eval too (`num_generations_eval`).
- it returns a dict with `prompt_ids`, `completion_ids` and `logprobs` (lists per entry, no padding); TRL pads
  them itself and does not cut completions to `max_completion_length`, so give `max_new_tokens` that value.
- every other key is an extra field merged into each entry's inputs for the reward functions (entry i of a list
  goes with prompt i); the one extra key TRL reads itself is `env_mask` (a 0/1 loss mask), which specmm never sets.
- `logprobs` become `sampling_per_token_logps`. The GRPO ratio uses the trainer's own log-probs; TRL reads the
  behaviour log-probs only in its off-policy sequence mask (`off_policy_mask_threshold`, any backend) and its
  vLLM importance-sampling correction (`use_vllm=True`). Without those they are carried, not used by the loss.
- TRL has no field for where a token came from: specmm's per-token `source` (draft or target), `step_spans` and
  `exact` go as extra fields, which only reward functions see; the loss treats every token alike. Mixed
  step-level rollouts (`exact` False) are off-policy in a way TRL cannot weigh; `TargetOnly()` with
  `inner_speculation=k` (exact token-level speculation) gives on-policy rollouts.

For on-policy GRPO, build the `StepSpeculator` with the very model object handed to the trainer (its target;
`trainer.model` is that object unless DeepSpeed or FSDP shards it), so rollouts follow the weights as they train;
the hook runs it in eval mode and restores the mode after.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from specmm.core.sampling import SamplingConfig
from specmm.reasoning.speculator import StepSpeculator

ROW_SEEDS = 1_000_003  # seeds per call and process: rows never share a generator stream


def grpo_rollout_func(speculator: StepSpeculator, *, max_new_tokens: int, sampling: SamplingConfig,
                      seed: int = 0, schedule: str = "lockstep", batch_size: int | None = None
                      ) -> Callable[[list, Any], dict]:
    """`rollout_func` for `trl.GRPOTrainer`: rollouts of `speculator`, each row with its own seed (call n of process
    r, row b: seed + (n * processes + r) * ROW_SEEDS + b), returned as `RolloutBatch.to_trl()`."""
    if not isinstance(speculator, StepSpeculator):
        raise ValueError(f"speculator: expected a StepSpeculator, got {type(speculator).__name__}")
    if not isinstance(sampling, SamplingConfig) or sampling.temperature <= 0:
        raise ValueError("sampling: GRPO needs sampled rollouts, a SamplingConfig with temperature > 0")
    calls = [0]

    def rollout(prompts: list, trainer) -> dict:
        if not all(isinstance(p, str) for p in prompts):
            raise ValueError("prompts: the specmm rollout hook takes text prompts; apply the chat template in the "
                             "dataset (conversational prompts are not rendered here)")
        accelerator = getattr(trainer, "accelerator", None)
        rank, size = (accelerator.process_index, accelerator.num_processes) if accelerator is not None else (0, 1)
        first = seed + (calls[0] * size + rank) * ROW_SEEDS
        calls[0] += 1
        models = [m for m in (speculator.target, speculator.draft) if m is not None]
        modes = [m.training for m in models]
        for m in models:
            m.eval()
        try:
            batch = speculator.generate(prompts, max_new_tokens=max_new_tokens, sampling=sampling,
                                        seed=[first + b for b in range(len(prompts))], schedule=schedule,
                                        batch_size=batch_size)
        finally:
            for m, mode in zip(models, modes):
                m.train(mode)
        return batch.to_trl()

    return rollout


__all__ = ["ROW_SEEDS", "grpo_rollout_func"]
