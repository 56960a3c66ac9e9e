"""SpecReason rollouts for RL: a small model drafts each reasoning step, the target scores it and regenerates the
steps it rejects; `RolloutBatch.to_trl()` gives prompt ids, completion ids, the behaviour log-probs every token
was sampled with, and which model produced each token. `grpo_rollout_func` wraps it as TRL's rollout hook:

    rollout = grpo_rollout_func(spec, max_new_tokens=1024, sampling=SamplingConfig(temperature=1.0))
    trainer = trl.GRPOTrainer(model=target, reward_funcs=[...], train_dataset=..., rollout_func=rollout)

(the speculator's target is the very model object given to the trainer, so rollouts follow its training).

    python examples/reason_rollouts.py --target path/to/reasoner --draft path/to/small-reasoner
    python examples/reason_rollouts.py --tiny
"""

from __future__ import annotations

import argparse
import random

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from specmm import SamplingConfig
from specmm.reasoning import DRAFT, JudgeTemplate, SpecReason, StepSpeculator
from specmm.reasoning.trl import grpo_rollout_func
from specmm.bench.report import TINY_WARNING


def tiny_setup():
    """Random Llamas on the zoo's ChainArith character vocabulary, its step delimiter and judge prompt, problems."""
    from specmm.zoo.chainarith_task import JUDGE, STEP, make_tokenizer, sample_problem

    tokenizer = make_tokenizer()

    def llama(seed: int, layers: int) -> LlamaForCausalLM:
        torch.manual_seed(seed)
        config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                             num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                             bos_token_id=None, eos_token_id=None, pad_token_id=0)
        return LlamaForCausalLM(config).double().eval()

    rng = random.Random(0)
    prompts = [sample_problem(rng).prompt for _ in range(3)]
    return llama(0, 2), llama(1, 1), tokenizer, [tokenizer.convert_tokens_to_ids(STEP)], JUDGE, prompts


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target")
    parser.add_argument("--draft")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--threshold", type=float, default=7.0, help="judge score (0-9) that keeps a draft step")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    args = parser.parse_args(argv)
    if args.tiny:
        print(TINY_WARNING)  # the same banner as every tiny-scale report
    if args.tiny:
        target, draft, tokenizer, delimiter, judge, prompts = tiny_setup()
    else:
        target = AutoModelForCausalLM.from_pretrained(args.target).eval()
        draft = AutoModelForCausalLM.from_pretrained(args.draft).eval()
        tokenizer = AutoTokenizer.from_pretrained(args.target, padding_side="left")
        delimiter, judge = "\n\n", "\nRate the last step from 0 to 9: "
        prompts = ["What is 17 * 23? Think step by step.", "Is 221 prime? Think step by step."]
    policy = SpecReason(args.threshold, template=JudgeTemplate.from_text(tokenizer, judge))
    spec = StepSpeculator(target, draft, tokenizer, policy, delimiter=delimiter, max_step_tokens=16)
    rollout = grpo_rollout_func(spec, max_new_tokens=args.max_new_tokens, sampling=SamplingConfig(temperature=1.0))
    rollouts = rollout(prompts, None)  # what GRPOTrainer receives (it passes itself instead of None)
    kept = sum(s == DRAFT for row in rollouts["source"] for s in row)
    print(f"{len(prompts)} rollouts, {kept} of {sum(map(len, rollouts['source']))} tokens from the draft")
    return {"trl": rollouts, "target": target, "tokenizer": tokenizer}


if __name__ == "__main__":
    main()
