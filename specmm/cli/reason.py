"""`specmm reason` (step speculation over prompts, JSON lines out, resumable) and `specmm bench reasoning`."""

from __future__ import annotations

import json

import torch
from tqdm.auto import tqdm

from specmm.cli.common import (
    local_path,
    scale_argument,
    command_line,
    default_device,
    device_arg,
    finite_float,
    float_range,
    int_range,
    loading,
    model_folder,
    nonnegative_int,
    positive_int,
    read_text_lines,
    temperature_arg,
)

POLICIES = ("target-only", "draft-only", "specreason", "arbitrage", "random")
REFILL_GROUP = 4  # with --refill, each generate call takes this many batches of prompts (journalled together)


def add_parsers(sub, bench_sub) -> None:
    """Register `reason` on the top-level parser and `reasoning` under `bench`."""
    reason = sub.add_parser("reason", help="step-level speculation (SpecReason, Arbitrage, ...) over prompts")
    source = reason.add_mutually_exclusive_group()
    source.add_argument("--zoo", default="chainarith", help="zoo entry with target, draft and router")
    source.add_argument("--target", help="local HF causal LM folder (with --draft and --prompts)")
    reason.add_argument("--draft", help="local HF folder of a smaller LM with the same tokenizer")
    reason.add_argument("--prompts", help="UTF-8 text file, one prompt per line (default with --zoo: held-out "
                        "problems)")
    reason.add_argument("--problems", type=int_range(1, 100_000), default=8,
                        help="held-out zoo problems when --prompts is not given")
    reason.add_argument("--policy", choices=POLICIES, default="specreason")
    reason.add_argument("--threshold", type=finite_float,
                        help="SpecReason score (0-9), Arbitrage probability, random p")
    reason.add_argument("--judge", default=None,
                        help="judge suffix text (default: chat template, or <JUDGE> on the zoo)")
    reason.add_argument("--delimiter", default=None,
                        help="step delimiter string (default: '\\n\\n'; <STEP> on the zoo)")
    reason.add_argument("--max-step-tokens", type=positive_int, default=256)
    reason.add_argument("--max-new-tokens", type=positive_int,
                        help="tokens per rollout at most (default: 1024 with --target; 96 on the zoo, whose models "
                        "have 256 positions)")
    reason.add_argument("--temperature", type=temperature_arg, default=0.0)
    reason.add_argument("--batch-size", type=positive_int, default=8, help="rows in flight")
    reason.add_argument("--schedule", choices=("lockstep", "async"), default="lockstep",
                        help="lockstep: a batch advances one step at a time; async: every row advances on its own "
                        "(same rollouts row by row)")
    reason.add_argument("--refill", action="store_true",
                        help="with --schedule async: a waiting prompt joins as each row finishes (continuous "
                        f"batching; rollouts are written every {REFILL_GROUP} batches)")
    reason.add_argument("--seed", type=nonnegative_int, default=0)
    scale_argument(reason)
    reason.add_argument("--device", type=device_arg, default=default_device())
    reason.add_argument("--out", required=True, help="output .jsonl (one rollout per line)")
    job = reason.add_mutually_exclusive_group()
    job.add_argument("--resume", action="store_true", help="continue the same job in --out: skip prompts already in it")
    job.add_argument("--force", action="store_true", help="discard what --out holds and start over")
    reason.set_defaults(func=cmd_reason)

    bench = bench_sub.add_parser("reasoning", help="ChainArith: target/draft-only, SpecReason, Arbitrage, random, "
                                 "token-level SD, lockstep and asynchronous; accuracy vs measured throughput")
    scale_argument(bench)
    bench.add_argument("--batch-sizes", type=positive_int, nargs="+", default=[1, 8, 64, 256])
    bench.add_argument("--problems", type=positive_int, nargs="+",
                       help="problems per batch size (default 64 64 128 512, else twice the batch)")
    bench.add_argument("--schedules", nargs="+", choices=("lockstep", "async"), default=["lockstep", "async"],
                       help="schedules of the step-level rows (target-only always runs in both)")
    bench.add_argument("--no-refill", action="store_true",
                       help="asynchronous rows do not refill finished rows from the waiting problems")
    bench.add_argument("--round-batches", type=positive_int, default=4,
                       help="batches of problems per interleaved round (what refill draws on)")
    bench.add_argument("--specreason-thresholds", type=float_range(0.0, 9.0), nargs="+", default=[3.0, 6.0, 8.0])
    bench.add_argument("--arbitrage-thresholds", type=float_range(0.0, 1.0), nargs="+", default=[0.2, 0.5, 0.8])
    bench.add_argument("--max-new-tokens", type=positive_int, default=96, help="tokens per completion at most")
    bench.add_argument("--max-step-tokens", type=positive_int, default=12, help="tokens per reasoning step at most")
    bench.add_argument("--compile", action="store_true",
                       help="also run the token-level SD row in compiled mode (warm-up on every batch; compile time "
                       "reported apart)")
    bench.add_argument("--device", type=device_arg, default=default_device())
    bench.add_argument("--out", default="benchmarks")
    bench.add_argument("--name", help="report file stem (default reasoning-chainarith-<scale>-<device>)")
    bench.set_defaults(func=cmd_bench_reasoning)


def _policy(args, threshold, models, tokenizer):
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
        if args.judge is None and models is None and not getattr(tokenizer, "chat_template", None):
            raise ValueError(f"--judge: --policy specreason asks the target to score each step, and the tokenizer of "
                             f"--target {args.target} has no chat template to ask with; pass --judge TEXT (the "
                             "suffix after which the target writes a 0-9 score), or use another --policy")
        try:
            template = JudgeTemplate.from_text(tokenizer, args.judge) if args.judge else (
                JudgeTemplate.from_text(tokenizer, "<JUDGE>") if models is not None else None)
        except ValueError as err:
            raise ValueError(f"--judge: {err}") from None
        return SpecReason(threshold, template=template, method="expected")
    if args.policy == "arbitrage":
        if models is None:
            raise ValueError("--policy arbitrage: needs the zoo's router (use --zoo)")
        return Arbitrage(models.router, threshold)
    return RandomRouting(threshold, seed=args.seed)


THRESHOLDS = {"specreason": (7.0, 0.0, 9.0, "the judge's 0-9 score"),
              "arbitrage": (0.5, 0.0, 1.0, "the router's probability"),
              "random": (0.5, 0.0, 1.0, "an escalation probability")}  # policy: (default, low, high, what)


def policy_threshold(policy: str, threshold: float | None) -> float | None:
    """`--threshold` of `policy` (its default when unset), checked before any model loads; None for a policy
    without one (refusing a threshold given to it)."""
    if policy not in THRESHOLDS:
        if threshold is not None:
            raise ValueError(f"--threshold: --policy {policy} has no threshold (it is for "
                             f"{', '.join(THRESHOLDS)})")
        return None
    default, low, high, what = THRESHOLDS[policy]
    if threshold is None:
        return default
    if not low <= threshold <= high:
        raise ValueError(f"--threshold: --policy {policy} takes a number in [{low:g}, {high:g}] ({what}), got "
                         f"{threshold:g}")
    return threshold


def item_keys(prompts: list[str]) -> list[str]:
    """One key per prompt: the hash of its text, then '#n' for its n-th repetition in the file."""
    from specmm.jobs import text_key

    seen: dict[str, int] = {}
    keys = []
    for prompt in prompts:
        key = text_key(prompt)
        seen[key] = seen.get(key, -1) + 1
        keys.append(f"{key}#{seen[key]}")
    return keys


def item_seed(seed: int, key: str) -> int:
    """A prompt's sampling seed: a function of the job seed and the prompt's key (not of its line number), so a
    resumed or reordered job samples each prompt as a fresh run would."""
    import hashlib

    return seed * 1_000_003 + int(hashlib.sha256(key.encode()).hexdigest()[:8], 16)


def _load_models(args, device):
    """(target, draft, tokenizer, zoo models or None, delimiter, fingerprints of what was loaded)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specmm.jobs import fingerprint

    if args.target:
        if not args.draft or not args.prompts:
            raise ValueError("--target: also give --draft and --prompts")
        args.target = local_path(model_folder("--target", args.target))
        args.draft = local_path(model_folder("--draft", args.draft))
        load = {"dtype": torch.float32, "attn_implementation": "sdpa"}
        with loading("--target", args.target):
            target = AutoModelForCausalLM.from_pretrained(args.target, **load).to(device).eval()
            tokenizer = AutoTokenizer.from_pretrained(args.target)
        with loading("--draft", args.draft):
            draft = AutoModelForCausalLM.from_pretrained(args.draft, **load).to(device).eval()
        prints = {"target": fingerprint(args.target), "draft": fingerprint(args.draft)}
        return target, draft, tokenizer, None, args.delimiter or "\n\n", prints
    from specmm import zoo
    from specmm.zoo import chainarith

    folder = zoo.build(args.zoo, args.scale)
    models = chainarith.load(folder, device=device)
    prints = {"zoo": f"{args.zoo}-{args.scale}", "models": fingerprint(folder)}
    return (models.target, models.draft, models.tokenizer, models, args.delimiter or [models.step_token_id],
            prints)


def cmd_reason(args) -> int:
    from specmm.core.context import check_budget, context_limit, context_problem
    from specmm.core.sampling import SamplingConfig
    from specmm.jobs import Job, check_file_output, pending_batches
    from specmm.jobs.shards import Processes, ShardedJournal, process_device
    from specmm.reasoning import StepSpeculator

    if args.refill and args.schedule != "async":
        raise ValueError("--refill: waiting prompts join a running batch only with --schedule async")
    if args.target:
        args.max_new_tokens = args.max_new_tokens or 1024
    else:  # the zoo's context is known before its models are built: refuse before any training
        from specmm.zoo import chainarith

        args.max_new_tokens = args.max_new_tokens or chainarith.MAX_NEW_TOKENS
        check_budget(args.max_new_tokens, chainarith.CONTEXT, "--max-new-tokens", 1)
    threshold = policy_threshold(args.policy, args.threshold)
    out = check_file_output(args.out, args.resume, args.force, "--out")
    prompts = read_text_lines("--prompts", args.prompts) if args.prompts else None
    if prompts == []:
        raise ValueError(f"--prompts: {args.prompts} holds no prompt (one per line)")
    sampling = SamplingConfig(temperature=args.temperature)
    device = process_device(args.device)  # under `accelerate launch`: this process's GPU
    target, draft, tokenizer, models, delimiter, prints = _load_models(args, device)
    if prompts is None:  # the zoo build (--target requires --prompts)
        prompts = [p.prompt for p in models.heldout_problems(args.problems)]
    policy = _policy(args, threshold, models, tokenizer)
    spec = StepSpeculator(target, draft, tokenizer, policy, delimiter=delimiter, max_step_tokens=args.max_step_tokens)
    template = getattr(policy, "template", None)
    extra = len(template.suffix_ids) + 1 if template is not None else 1  # a judge prompt after the last step
    limits = [x for x in (context_limit(target), context_limit(draft)) if x is not None]
    limit = min(limits) if limits else None
    check_budget(args.max_new_tokens, limit, "--max-new-tokens", extra)
    settings = {"policy": spec.policy.name, "threshold": threshold, "judge": args.judge, "delimiter": repr(delimiter),
                "max_step_tokens": args.max_step_tokens, "max_new_tokens": args.max_new_tokens,
                "temperature": args.temperature, "seed": args.seed, **prints}
    # every row draws from its own generators (random routing too): batches and schedule leave rollouts unchanged

    keys = item_keys(prompts)
    job = Job(out, "reason", settings, resume=args.resume, force=args.force, argument="--out")
    processes = Processes(cpu=device.type == "cpu")
    kept = checked = new = 0
    with ShardedJournal(job, "key", processes, what="rollout") as journal:
        done = set(journal.done_keys)  # every process knows the keys; records stay in the output
        skipped = sum(k in done for k in keys)
        fits, errors = [], []
        for i, prompt in enumerate(prompts):  # prompts that cannot fit become error lines; the rest run as usual
            if keys[i] in done:
                fits.append(i)
                continue
            problem = context_problem(len(tokenizer.encode(prompt)), args.max_new_tokens, limit, extra,
                                      "judge prompt" if template is not None else "closing token")
            if problem:
                errors.append({"key": keys[i], "index": i, "prompt": prompt, "error": f"prompt: {problem}"})
            else:
                fits.append(i)
        if processes.is_main:  # every process finds the same errors: the main one writes them
            journal.append(errors)
        done.update(r["key"] for r in errors)
        group = args.batch_size * (REFILL_GROUP if args.refill else 1)
        batches = pending_batches(fits, group, lambda i: keys[i] in done)
        with tqdm(total=sum(keys[i] not in done for i in fits), desc=f"reason {spec.policy.name}", unit="prompt",
                  disable=not processes.is_main) as bar:
            for rows in processes.my_share(batches):
                batch = spec.generate([prompts[i] for i in rows], max_new_tokens=args.max_new_tokens,
                                      sampling=sampling, seed=[item_seed(args.seed, keys[i]) for i in rows],
                                      schedule=args.schedule, batch_size=args.batch_size, refill=args.refill)
                records = []
                for j, i in enumerate(rows):
                    if keys[i] in done:  # done before a resume (rows are independent: re-running changes nothing)
                        continue
                    decisions = batch.decisions[j]
                    kept += sum(d for d in decisions if d is not None)
                    checked += sum(d is not None for d in decisions)
                    n = len(batch.completions[j])
                    records.append({"key": keys[i], "index": i, "prompt": prompts[i],
                                    "completion": tokenizer.decode(batch.completions[j]),
                                    "completion_ids": batch.completions[j],
                                    "behaviour_logprobs": batch.behaviour_logprobs[j, :n].tolist(),
                                    "source": batch.source[j, :n].tolist(), "step_spans": batch.step_spans[j],
                                    "scores": batch.scores[j], "decisions": decisions, "exact": batch.exact})
                journal.append(records)
                new += len(records)
                bar.update(max(journal.written() - bar.n, 0) if processes.size > 1 else len(records))
        journal.finish(keys)  # lines in input order (merged from every process), as one uninterrupted run leaves
        kept, checked, new = (sum(c) for c in zip(*processes.gather((kept, checked, new))))
    if not processes.is_main:
        return 0
    rate = f"{kept / checked:.2f}" if checked else "-"
    print(f"{new} prompts ({skipped} skipped, {len(errors)} errors), {spec.policy.name}: draft steps kept {rate} "
          f"-> {out}")
    return 0


def cmd_bench_reasoning(args) -> int:
    from specmm import zoo
    from specmm.bench.reasoning import ReasoningBenchSetup, bench_reasoning, write
    from specmm.zoo import chainarith

    device = torch.device(args.device)
    problems = args.problems or [{1: 64, 8: 64, 64: 128, 256: 512}.get(b, 2 * b) for b in args.batch_sizes]
    if len(problems) != len(args.batch_sizes) or min(problems) < 1 or min(args.batch_sizes) < 1:
        raise ValueError("--problems: give one positive count per --batch-sizes entry")
    setup = ReasoningBenchSetup(batch_sizes=tuple(args.batch_sizes), problems=dict(zip(args.batch_sizes, problems)),
                                specreason_thresholds=tuple(args.specreason_thresholds),
                                arbitrage_thresholds=tuple(args.arbitrage_thresholds), compile=args.compile,
                                max_new_tokens=args.max_new_tokens, max_step_tokens=args.max_step_tokens,
                                schedules=tuple(dict.fromkeys(args.schedules)), refill=not args.no_refill,
                                round_batches=args.round_batches)
    models = chainarith.load(zoo.build("chainarith", args.scale), device=device)
    record = models.record
    description = {"models": f"zoo chainarith-{args.scale}",
                   "target": f"{record['models']['target']['parameters'] / 1e6:.2f}M params",
                   "draft": f"{record['models']['draft']['parameters'] / 1e6:.3f}M params",
                   "held-out (zoo.json)": json.dumps(record.get("heldout", {})),
                   "router (zoo.json)": json.dumps(record.get("router", {})),
                   "torch threads": torch.get_num_threads()}
    stem = args.name or f"reasoning-chainarith-{args.scale}-{device.type}"

    def write_so_far(reports, results):  # after each batch size: a run stopped part-way keeps what it finished
        print(f"\n{reports[-1].name}\n{reports[-1].table()}", flush=True)
        paths = write(reports, results, args.out, stem, pending=setup.batch_sizes[len(reports):])
        print("wrote " + ", ".join(str(p) for p in paths), flush=True)

    bench_reasoning(models, setup, command=command_line(), description=description, device=device,
                    on_batch=write_so_far)
    return 0


__all__ = ["add_parsers"]
