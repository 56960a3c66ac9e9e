"""Zoo entry `chainarith`: a deep Llama target, a weaker two-layer draft and an Arbitrage router on ChainArith.

The target is trained on solutions and, multi-task, to emit a judge digit after `<JUDGE>` (9 for a valid
step, 0 for a corrupted one), so SpecReason's self-judge is one prefill; the draft is narrower and shallower
(two layers: copying an operand from the prompt is an induction-style lookup one layer cannot do), so it
fails mostly on products. The router is fitted on oracle labels (advantage of target samples
over the draft step under the exact step checker), with features from the draft's own step.
"""

from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

from specmm.core.sampling import GREEDY
from specmm.jobs import atomic_writer
from specmm.reasoning import (
    DraftOnly,
    OracleRouting,
    StepRouter,
    StepSpeculator,
    TargetOnly,
    train_router,
)
from specmm.zoo.chainarith_task import (
    BAD,
    GOOD,
    JUDGE,
    STEP,
    StepChecker,
    answer_of,
    corrupt,
    is_hard,
    make_tokenizer,
    sample_problem,
)
from specmm.zoo.lm_training import (
    GPU_TRAINING,
    IGNORE,
    LMTrainConfig,
    save_trained_lm,
    train_causal_lm,
)

logger = logging.getLogger(__name__)

HELDOUT_SEED = 1_000_000  # held-out problems come from this stream, training problems never do
SEQ_LEN = 104

RECIPES = {
    "tiny": {
        "target": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64},
        "draft": {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 1, "intermediate_size": 32},
        "target_train": {"steps": 6, "batch_size": 8, "checkpoint_every": 3, "warmup_steps": 2},
        "draft_train": {"steps": 4, "batch_size": 8, "checkpoint_every": 2, "warmup_steps": 2},
        "judge_share": 0.3, "router_problems": 8, "router_samples": 2, "router_steps": 20, "eval_problems": 8},
    # ~18 minutes on 2 idle CPU cores. The target is deep and narrow: at batch 1 these tiny models cost
    # ~0.5 ms per layer of framework overhead whatever their width, so 16 layers against the draft's 2 give
    # the ~5x per-token latency ratio of a real 32B/1.5B pair (a 4-layer target gave 1.6x: no room to win).
    # Steps are 30% products, as chains of thought are mostly easy steps; judge digits weigh 20 tokens.
    "cpu": {
        "target": {"hidden_size": 96, "num_hidden_layers": 16, "num_attention_heads": 4, "intermediate_size": 256},
        "draft": {"hidden_size": 48, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 128},
        "target_train": {"steps": 2000, "batch_size": 32, "lr": 2e-3, "warmup_steps": 100, "checkpoint_every": 100},
        "draft_train": {"steps": 800, "batch_size": 32, "lr": 3e-3, "warmup_steps": 40, "checkpoint_every": 100},
        "hard_share": 0.3, "judge_share": 0.3, "judge_weight": 20.0, "router_problems": 192, "router_samples": 4,
        "router_steps": 400, "eval_problems": 128},
    # the `reasoning` step on one H100 (untested: no GPU run yet). Target ~85M params (768 wide, 12 layers), 3000
    # steps x 128 x 104 = 40M tokens: 6 x 85M x 40M = 2e16 FLOPs, ~1 min at 400 TFLOP/s; draft ~5M (1/16 of the
    # target, as SpecReason's 1.5B draft is to its 32B target) in <1 min. The router's labelling rollouts and the
    # evaluation run where the builder keeps the models (CPU), hence their modest problem counts (~2 min).
    "gpu": {
        "target": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 2048},
        "draft": {"hidden_size": 384, "num_hidden_layers": 3, "num_attention_heads": 6, "intermediate_size": 1024},
        "target_train": {"steps": 3000, "batch_size": 128, "lr": 1.5e-3, "warmup_steps": 200,
                         "checkpoint_every": 500, **GPU_TRAINING},
        "draft_train": {"steps": 2000, "batch_size": 128, "lr": 2e-3, "warmup_steps": 100, "checkpoint_every": 500,
                        **GPU_TRAINING},
        "hard_share": 0.3, "judge_share": 0.3, "judge_weight": 20.0, "router_problems": 256, "router_samples": 2,
        "router_steps": 400, "eval_problems": 256},
}


def heldout_problems(count: int, hard_share: float = 0.5) -> list:
    rng = random.Random(HELDOUT_SEED)
    return [sample_problem(rng, hard_share=hard_share) for _ in range(count)]


def hard_share_of(recipe: dict) -> float:
    """The share of product steps in a recipe's problems (0.5 for builds made before it was a knob)."""
    return recipe.get("hard_share", 0.5)


def training_example(rng: random.Random, tokenizer, judge_share: float,
                     hard_share: float = 0.5) -> tuple[list[int], list[int], bool]:
    """(input ids, labels, is_judge): a full solution (loss on the solution), or a judge example (loss on
    the digit only)."""
    problem = sample_problem(rng, hard_share=hard_share)
    steps = problem.steps()
    prompt = tokenizer.encode(problem.prompt)
    if rng.random() >= judge_share:
        solution = tokenizer.encode("".join(steps))
        return prompt + solution, [IGNORE] * len(prompt) + solution, False
    k = rng.randrange(len(steps))
    candidate = steps[k] if rng.random() < 0.5 else corrupt(steps[k], rng)
    digit = GOOD if candidate == steps[k] else BAD
    ids = prompt + tokenizer.encode("".join(steps[:k]) + candidate + JUDGE + digit)
    return ids, [IGNORE] * (len(ids) - 1) + [ids[-1]], True


def batches(tokenizer, config: LMTrainConfig, judge_share: float, hard_share: float = 0.5,
            judge_weight: float = 1.0):
    """make_batch(step): right-padded [B, SEQ_LEN] examples and per-label loss weights (`judge_weight` on
    a judge digit, 1 elsewhere), a pure function of (seed, step)."""
    pad = tokenizer.pad_token_id

    def make_batch(step: int) -> dict[str, torch.Tensor]:
        rng = random.Random(config.seed * 1_000_003 + step)
        ids = torch.full((config.batch_size, SEQ_LEN), pad, dtype=torch.long)
        labels = torch.full_like(ids, IGNORE)
        weights = torch.ones(ids.shape)
        for b in range(config.batch_size):
            x, y, is_judge = training_example(rng, tokenizer, judge_share, hard_share)
            ids[b, : len(x)], labels[b, : len(y)] = torch.tensor(x), torch.tensor(y)
            if is_judge:
                weights[b] = judge_weight
        width = int((ids != pad).sum(1).max())  # trim the common padding
        return {"input_ids": ids[:, :width], "labels": labels[:, :width], "weights": weights[:, :width]}

    return make_batch


CONTEXT = 256  # positions of every chainarith model (prompt, steps and judge prompts together)
MAX_NEW_TOKENS = 96  # a completion's budget that fits beside the longest problem


def make_model(size: dict, tokenizer, seed: int) -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=len(tokenizer), max_position_embeddings=CONTEXT, num_key_value_heads=size[
        "num_attention_heads"], bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False, **size)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def evaluate(target, draft, tokenizer, count: int, hard_share: float = 0.5) -> dict:
    """Greedy answer accuracy and per-type step validity of target-only and draft-only decoding."""
    problems = heldout_problems(count, hard_share)
    checker = StepChecker(tokenizer)
    result = {}
    for name, policy in (("target", TargetOnly()), ("draft", DraftOnly())):
        spec = StepSpeculator(target, draft, tokenizer, policy, delimiter=[tokenizer.convert_tokens_to_ids(STEP)],
                              max_step_tokens=12)
        out = spec.generate([p.prompt for p in problems], max_new_tokens=96, sampling=GREEDY)
        correct, valid = 0, {"easy": [], "hard": []}
        for b, problem in enumerate(problems):
            completion = out.completions[b]
            correct += answer_of(tokenizer.decode(completion)) == problem.answer
            prompt = tokenizer.encode(problem.prompt)
            for start, end in out.step_spans[b]:
                context = prompt + completion[:start]
                kind = "hard" if is_hard(tokenizer.decode(context)) else "easy"
                valid[kind].append(checker([context], [completion[start:end]])[0])
        result[name] = {"accuracy": correct / count,
                        **{f"{k}_step_validity": sum(v) / max(len(v), 1) for k, v in valid.items()}}
    return result


def collect_router_data(target, draft, tokenizer, recipe: dict, seed: int) -> dict[str, torch.Tensor]:
    """Draft-side features and oracle advantages on training problems (greedy draft, sampled target)."""
    rng = random.Random(seed + 77)
    problems = [sample_problem(rng, hard_share=hard_share_of(recipe)) for _ in range(recipe["router_problems"])]
    policy = OracleRouting(StepChecker(tokenizer), samples=recipe["router_samples"], seed=seed)
    spec = StepSpeculator(target, draft, tokenizer, policy, delimiter=[tokenizer.convert_tokens_to_ids(STEP)],
                          max_step_tokens=12)
    for i in range(0, len(problems), 64):
        spec.generate([p.prompt for p in problems[i: i + 64]], max_new_tokens=96, sampling=GREEDY)
    return {"features": torch.cat(policy.features), "advantages": torch.cat(policy.advantages)}


def build(dest: Path, recipe: dict, seed: int, progress: bool) -> dict:
    work = dest / "work"
    work.mkdir(parents=True, exist_ok=True)
    tokenizer = make_tokenizer()
    hard_share = hard_share_of(recipe)
    record = {"task": f"ChainArith: 3-6 ops mod 100 (+1..9 easy, *2..9 hard, {hard_share:.0%} hard)", "models": {}}
    trained = {}
    for offset, role in enumerate(("draft", "target")):
        model = make_model(recipe[role], tokenizer, seed + offset)
        config = LMTrainConfig(seq_len=SEQ_LEN, seed=seed + offset, **recipe[f"{role}_train"])
        share = recipe["judge_share"] if role == "target" else 0.0
        make_batch = batches(tokenizer, config, share, hard_share, recipe.get("judge_weight", 1.0))
        losses = train_causal_lm(model, make_batch, config, work / role,
                                 desc=f"chainarith/{role}", progress=progress)
        record["models"][role] = save_trained_lm(model, tokenizer, dest / role, losses, config)
        trained[role] = model
    target, draft = trained["target"], trained["draft"]
    record["heldout"] = evaluate(target, draft, tokenizer, recipe["eval_problems"], hard_share)
    data_file = work / "router_data.pt"
    if data_file.is_file():
        data = torch.load(data_file, weights_only=True)
    else:
        data = collect_router_data(target, draft, tokenizer, recipe, seed)
        with atomic_writer(data_file) as f:  # a cache a killed build may resume from: whole or absent
            torch.save(data, f)
    router, stats = train_router(data["features"], data["advantages"], draft.config.hidden_size,
                                 steps=recipe["router_steps"], seed=seed)
    router.save_pretrained(dest / "router")
    record["router"] = stats
    return record


@dataclass
class ChainArithModels:
    target: LlamaForCausalLM
    draft: LlamaForCausalLM
    tokenizer: PreTrainedTokenizerFast
    router: StepRouter
    record: dict

    @property
    def step_token_id(self) -> int:
        return self.tokenizer.convert_tokens_to_ids(STEP)

    def heldout_problems(self, count: int) -> list:
        """Held-out problems with this build's share of product steps."""
        return heldout_problems(count, hard_share_of(self.record.get("recipe", {})))


def load(path: Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> ChainArithModels:
    """Load a built entry as a user's folders would load."""
    kwargs = {"dtype": dtype, "attn_implementation": "sdpa"}
    target = AutoModelForCausalLM.from_pretrained(path / "target", **kwargs).to(device).eval()
    draft = AutoModelForCausalLM.from_pretrained(path / "draft", **kwargs).to(device).eval()
    tokenizer = PreTrainedTokenizerFast.from_pretrained(path / "target")
    tokenizer.padding_side = "left"
    router = StepRouter.from_pretrained(path / "router", device)
    record = json.loads((path / "zoo.json").read_text()) if (path / "zoo.json").is_file() else {}
    return ChainArithModels(target, draft, tokenizer, router, record)
