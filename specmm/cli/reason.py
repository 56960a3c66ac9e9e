"""`specmm reason` (step speculation over prompts, JSON lines out, resumable) and `specmm bench reasoning`."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from specmm.cli.common import command_line, default_device

POLICIES = ("target-only", "draft-only", "specreason", "arbitrage", "random")


def add_parsers(sub, bench_sub) -> None:
    """Register `reason` on the top-level parser and `reasoning` under `bench`."""
    reason = sub.add_parser("reason", help="step-level speculation (SpecReason, Arbitrage, ...) over prompts")
    source = reason.add_mutually_exclusive_group()
    source.add_argument("--zoo", default="chainarith", help="zoo entry with target, draft and router")
    source.add_argument("--target", help="local HF causal LM folder (with --draft and --prompts)")
    reason.add_argument("--draft", help="local HF folder of a smaller LM with the same tokenizer")
    reason.add_argument("--prompts", help="text file, one prompt per line (default with --zoo: held-out problems)")
    reason.add_argument("--problems", type=int, default=8, help="held-out zoo problems when --prompts is not given")
    reason.add_argument("--policy", choices=POLICIES, default="specreason")
    reason.add_argument("--threshold", type=float, help="SpecReason score (0-9), Arbitrage probability, random p")
    reason.add_argument("--judge", default=None, help="judge suffix text (default: chat template, or <JUDGE> on the zoo)")
    reason.add_argument("--delimiter", default=None, help="step delimiter string (default: '\\n\\n'; <STEP> on the zoo)")
    reason.add_argument("--max-step-tokens", type=int, default=256)
    reason.add_argument("--max-new-tokens", type=int, default=1024)
    reason.add_argument("--temperature", type=float, default=0.0)
    reason.add_argument("--batch-size", type=int, default=8)
    reason.add_argument("--seed", type=int, default=0)
    reason.add_argument("--scale", default="cpu")
    reason.add_argument("--device", default=default_device())
    reason.add_argument("--out", required=True, help="output .jsonl (one rollout per line)")
    reason.add_argument("--resume", action="store_true", help="skip prompts already in --out")
    reason.set_defaults(func=cmd_reason)

    bench = bench_sub.add_parser("reasoning", help="ChainArith: target/draft-only, SpecReason, Arbitrage, random, "
                                 "token-level SD; accuracy vs measured latency")
    bench.add_argument("--scale", default="cpu")
    bench.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 64])
    bench.add_argument("--problems", type=int, nargs="+", help="problems per batch size (default 64 64 128)")
    bench.add_argument("--specreason-thresholds", type=float, nargs="+", default=[3.0, 6.0, 8.0])
    bench.add_argument("--arbitrage-thresholds", type=float, nargs="+", default=[0.2, 0.5, 0.8])
    bench.add_argument("--compile", action="store_true",
                       help="also run the token-level SD row in compiled mode (warm-up on every batch; compile time "
                       "reported apart)")
    bench.add_argument("--device", default=default_device())
    bench.add_argument("--out", default="benchmarks")
    bench.add_argument("--name", help="report file stem (default reasoning-chainarith-<scale>-<device>)")
    bench.set_defaults(func=cmd_bench_reasoning)


def _policy(args, models, tokenizer):
    from specmm.reasoning import (
        Arbitrage,
        DraftOnly,
        JudgeTemplate,
        RandomRouting,
        SpecReason,
        TargetOnly,
    )

    if args.policy == "target-only":
        return TargetOnly()
    if args.policy == "draft-only":
        return DraftOnly()
    if args.policy == "specreason":
        template = JudgeTemplate.from_text(tokenizer, args.judge) if args.judge else (
            JudgeTemplate.from_text(tokenizer, "<JUDGE>") if models is not None else None)
        return SpecReason(7.0 if args.threshold is None else args.threshold, template=template, method="expected")
    if args.policy == "arbitrage":
        if models is None:
            raise ValueError("--policy arbitrage: needs the zoo's router (use --zoo)")
        return Arbitrage(models.router, 0.5 if args.threshold is None else args.threshold)
    return RandomRouting(0.5 if args.threshold is None else args.threshold, seed=args.seed)


def cmd_reason(args) -> int:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specmm.core.sampling import SamplingConfig
    from specmm.reasoning import StepSpeculator

    out = Path(args.out)
    if out.exists() and not args.resume:
        raise ValueError(f"--out: {out} exists; pass --resume to continue it or choose another file")
    sampling = SamplingConfig(temperature=args.temperature)
    device = torch.device(args.device)
    models = None
    if args.target:
        if not args.draft or not args.prompts:
            raise ValueError("--target: also give --draft and --prompts")
        load = {"dtype": torch.float32, "attn_implementation": "sdpa"}
        target = AutoModelForCausalLM.from_pretrained(args.target, **load).to(device).eval()
        draft = AutoModelForCausalLM.from_pretrained(args.draft, **load).to(device).eval()
        tokenizer = AutoTokenizer.from_pretrained(args.target)
        delimiter = args.delimiter or "\n\n"
    else:
        from specmm import zoo
        from specmm.zoo import chainarith

        models = chainarith.load(zoo.build(args.zoo, args.scale), device=device)
        target, draft, tokenizer = models.target, models.draft, models.tokenizer
        delimiter = args.delimiter or [models.step_token_id]
    if args.prompts:
        prompts = [line for line in Path(args.prompts).read_text().splitlines() if line.strip()]
    else:  # the zoo build (--target requires --prompts)
        prompts = [p.prompt for p in models.heldout_problems(args.problems)]
    done = set()
    if out.exists():
        done = {json.loads(line)["index"] for line in out.read_text().splitlines() if line.strip()}
    spec = StepSpeculator(target, draft, tokenizer, _policy(args, models, tokenizer), delimiter=delimiter,
                          max_step_tokens=args.max_step_tokens)
    todo = [i for i in range(len(prompts)) if i not in done]
    kept = checked = 0
    with out.open("a") as f:
        for start in range(0, len(todo), args.batch_size):
            rows = todo[start: start + args.batch_size]
            batch = spec.generate([prompts[i] for i in rows], max_new_tokens=args.max_new_tokens, sampling=sampling,
                                  seed=[args.seed + i for i in rows])
            for j, i in enumerate(rows):
                decisions = batch.decisions[j]
                kept += sum(d for d in decisions if d is not None)
                checked += sum(d is not None for d in decisions)
                f.write(json.dumps({"index": i, "prompt": prompts[i], "completion": tokenizer.decode(
                    batch.completions[j]), "completion_ids": batch.completions[j],
                    "behaviour_logprobs": batch.behaviour_logprobs[j, : len(batch.completions[j])].tolist(),
                    "source": batch.source[j, : len(batch.completions[j])].tolist(), "step_spans": batch.step_spans[j],
                    "scores": batch.scores[j], "decisions": decisions, "exact": batch.exact}) + "\n")
            f.flush()
    rate = f"{kept / checked:.2f}" if checked else "-"
    print(f"{len(todo)} prompts ({len(done)} skipped), {spec.policy.name}: draft steps kept {rate} -> {out}")
    return 0


def cmd_bench_reasoning(args) -> int:
    from specmm import zoo
    from specmm.bench.reasoning import ReasoningBenchSetup, bench_reasoning, write
    from specmm.zoo import chainarith

    device = torch.device(args.device)
    problems = args.problems or [{1: 64, 8: 64, 64: 128}.get(b, 2 * b) for b in args.batch_sizes]
    if len(problems) != len(args.batch_sizes) or min(problems) < 1 or min(args.batch_sizes) < 1:
        raise ValueError("--problems: give one positive count per --batch-sizes entry")
    setup = ReasoningBenchSetup(batch_sizes=tuple(args.batch_sizes), problems=dict(zip(args.batch_sizes, problems)),
                                specreason_thresholds=tuple(args.specreason_thresholds),
                                arbitrage_thresholds=tuple(args.arbitrage_thresholds), compile=args.compile)
    models = chainarith.load(zoo.build("chainarith", args.scale), device=device)
    record = models.record
    description = {"models": f"zoo chainarith-{args.scale}",
                   "target": f"{record['models']['target']['parameters'] / 1e6:.2f}M params",
                   "draft": f"{record['models']['draft']['parameters'] / 1e6:.3f}M params",
                   "held-out (zoo.json)": json.dumps(record.get("heldout", {})),
                   "router (zoo.json)": json.dumps(record.get("router", {})),
                   "torch threads": torch.get_num_threads()}
    reports, results = bench_reasoning(models, setup, command=command_line(), description=description, device=device)
    for report in reports:
        print(f"\n{report.name}\n{report.table()}")
    paths = write(reports, results, args.out, args.name or f"reasoning-chainarith-{args.scale}-{device.type}")
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


__all__ = ["add_parsers"]
