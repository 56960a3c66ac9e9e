"""`specmm bench ssm`: AR vs chain SD with replay rollback vs STree (static and dynamic trees) on SSM targets.

Per target (the zoo's Mamba2 and Bamba hybrid), side by side in one process on the same left-padded prompts:
HF `generate` (greedy, batched, the model's own cached decode step) as the AR baseline; chain speculative decoding
whose SSM states roll back by replaying the accepted inputs (the vanilla method); STree, i.e. tree verification
with closed-form state commits, on a static and a dynamic tree. The drafter is the `code` entry's small Llama, as
trained on the corpus ("code draft") and/or distilled onto each target (zoo `ssm-code-drafts`, "distilled draft");
with both, every speculative row runs once per draft, each labelled.

With "compiled" in `setup.modes` every speculative row also runs in the core's compiled mode (the SSM target's
verify and state commit compiled per tree shape, a static KV cache for hybrids' attention, the draft compiled), and
HF `generate` over its static cache with the decode step compiled joins as a second baseline (transformers 5.x
builds static caches for these models: Mamba2 layers hold fixed-size states). Compile time is measured in the
warm-up and reported apart; speculative rows get the per-round time split from one extra profiled run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

import specmm
from specmm.bench.core import _describe, plain_decoding, new_token_rows, speculative_method, timing_note
from specmm.bench.fast_path import FastPathSetup, hf_compile_scope
from specmm.bench.harness import BenchReport, BenchRow, Method, RunResult
from specmm.bench.harness import output_repetition, partial_reports, run_benchmark
from specmm.bench.ties import logit_tie_judge
from specmm.drafters import ModelDrafter
from specmm.machine import machine_info
from specmm.ssm import SSMTarget

STATIC_TREE = ((0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 0, 0, 0),
               (0, 0, 0, 1))  # 12 nodes with the root, depth 4 (STree's static trees are 12-18 nodes, depth 4)
SMALL_STATIC_TREE = ((0,), (1,), (0, 0), (1, 0), (0, 0, 0))  # 6 nodes, depth 3: on CPU verify cost grows with nodes
STATIC_TREES = {"small": SMALL_STATIC_TREE, "large": STATIC_TREE}
# Draft shapes per device (as in `specmm bench core`): on CPU every extra node and draft step costs visibly.
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DRAFTS = ("code", "distilled")
DEVICE_DEFAULTS = {"cpu": {"k": 2, "static": SMALL_STATIC_TREE, "depth": 3, "top_k": 2, "total_tokens": 8},
                   "cuda": {"k": 4, "static": STATIC_TREE, "depth": 5, "top_k": 4, "total_tokens": 16}}


@dataclass
class SSMBenchSetup(FastPathSetup):
    max_new_tokens: int = 64
    k: tuple[int, ...] = (4,)  # chain lengths: a chain row (replay and closed form) per length
    static: specmm.TreeSpec = field(default_factory=lambda: specmm.TreeSpec.static(STATIC_TREE))
    dynamic: specmm.TreeSpec = field(default_factory=lambda: specmm.TreeSpec.dynamic(depth=5, top_k=4,
                                                                                    total_tokens=16))
    pad_token_id: int = 0
    repeats: int = 3
    warmup: int = 1


def ssm_methods(target: nn.Module, draft: nn.Module | dict[str, nn.Module], input_ids: Tensor,
                attention_mask: Tensor, setup: SSMBenchSetup) -> list[Method]:
    """The rows of one target: AR baselines, then per mode and per draft (`{label: model}`, or one model) the chain
    and STree rows; with several drafts each row's name ends in `[label draft]`."""
    width, pad, new = input_ids.shape[1], setup.pad_token_id, setup.max_new_tokens
    drafts = draft if isinstance(draft, dict) else {"": draft}

    def autoregressive(static: bool):
        return lambda: plain_decoding(target, input_ids, attention_mask, static, new, pad, None, min_new_tokens=new)

    def speculative(name: str, commit_mode: str, tree: specmm.TreeSpec, mode: str, draft: nn.Module,
                    note: str = "") -> Method:
        def make(compile: bool, profile: bool):
            return specmm.SpeculativeGenerator(SSMTarget(target, commit_mode=commit_mode), ModelDrafter(draft),
                                               tree=tree, compile=compile, profile=profile)

        def generate(gen):
            out = gen.generate(input_ids, attention_mask=attention_mask, max_new_tokens=new, pad_token_id=pad)
            return RunResult(new_token_rows(out.sequences, width, None, pad)), out.stats
        method = speculative_method(name, make, generate, mode, setup.profile)
        method.note = note
        return method

    batch = input_ids.shape[0]
    methods = [Method(f"AR (HF generate, batch {batch})", autoregressive(False), baseline=True)]
    if setup.hf_static:
        methods.append(Method(f"AR (HF generate, static cache + torch.compile, batch {batch})", autoregressive(True),
                              baseline=True, compiled=True,
                              note="HF's own compiled decoding: static cache, decode step compiled, prefill eager"))
    for mode in setup.modes:
        for label, model in drafts.items():
            tag = f" [{label} draft]" if len(drafts) > 1 else ""
            for k in setup.k:
                chain = specmm.TreeSpec.chain(k)
                methods += [
                    speculative(f"chain SD k={k}, replay rollback{tag}", "replay", chain, mode, model,
                                note="vanilla SSM speculative decoding: re-scan the accepted inputs to roll the state "
                                "forward"),
                    speculative(f"chain SD k={k}, closed-form commit{tag}", "closed_form", chain, mode, model)]
            methods += [
                speculative(f"STree {_describe(setup.static)}{tag}", "closed_form", setup.static, mode, model),
                speculative(f"STree {_describe(setup.dynamic)}{tag}", "closed_form", setup.dynamic, mode, model),
            ]
    return methods


def bench_ssm(target: nn.Module, draft: nn.Module | dict[str, nn.Module], input_ids: Tensor, attention_mask: Tensor,
              setup: SSMBenchSetup, *, name: str, command: str, models: dict, notes: list[str],
              progress: bool = True, checkpoint: Callable[[BenchReport], None] | None = None
              ) -> tuple[BenchReport, dict[str, RunResult]]:
    """Run the SSM methods side by side on one target (one draft, or `{label: draft}`); returns the report and
    every method's outputs. `checkpoint(report)` gets the partial report after every timed round."""
    device = next(target.parameters()).device

    def report_of(rows: list[BenchRow], outputs: dict[str, RunResult], partial: str = "") -> BenchReport:
        repetition, warnings = output_repetition(outputs)
        info = {"batch": input_ids.shape[0], "prompt tokens (max)": input_ids.shape[1],
                "max_new_tokens": setup.max_new_tokens, "sampling": "greedy",
                "specmm modes": ", ".join(setup.modes), "timing": timing_note(setup),
                **repetition, **models}
        return BenchReport(name=name, command=command, rows=rows, setup=info, notes=notes + warnings,
                           machine=machine_info(device), partial=partial)

    with torch.no_grad(), hf_compile_scope(target):
        rows, outputs = run_benchmark(ssm_methods(target, draft, input_ids, attention_mask, setup), device,
                                      repeats=setup.repeats, warmup=setup.warmup, progress=progress,
                                      ties=logit_tie_judge(target, input_ids, attention_mask),
                                      checkpoint=partial_reports(report_of, checkpoint, setup.repeats))
    report = report_of(rows, outputs)
    return report, outputs


# ------------------------------------------------------------------------------------------------ command line

def add_parser(bench_subparsers, positive_int) -> None:
    """Register `specmm bench ssm` on the `bench` subcommand's subparsers."""
    p = bench_subparsers.add_parser("ssm", help="SSM / hybrid targets: AR vs chain SD with replay vs STree trees")
    p.add_argument("--scale", default="cpu", help="zoo scale of ssm-code (and of the code draft)")
    p.add_argument("--targets", nargs="+", default=["mamba2", "hybrid"], choices=["mamba2", "hybrid"])
    p.add_argument("--drafts", nargs="+", default=list(DRAFTS), choices=list(DRAFTS),
                   help="code: the code entry's draft as trained; distilled: that draft distilled onto each target "
                   "(zoo ssm-code-drafts, built if needed); both (default): every speculative row once per draft")
    p.add_argument("--batch-size", type=positive_int, default=4)
    p.add_argument("--no-repeat-ngram-size", type=positive_int,
                   help="set on the target's generation_config (HF generate and every specmm row honour it): "
                   "greedy output without repeated n-grams, i.e. without loops")
    p.add_argument("--max-new-tokens", type=positive_int, default=64)
    p.add_argument("--k", type=positive_int, nargs="+",
                   help="chain lengths, a chain row each (default: 2 on CPU, 4 on CUDA)")
    p.add_argument("--static-tree", choices=sorted(STATIC_TREES),
                   help="the STree static row's tree: small (6 nodes, depth 3; default on CPU) or large (12 nodes, "
                   "depth 4; default on CUDA)")
    p.add_argument("--depth", type=positive_int, help="dynamic tree depth (default: 3 on CPU, 5 on CUDA)")
    p.add_argument("--top-k", type=positive_int, help="dynamic tree branching (default: 2 on CPU, 4 on CUDA)")
    p.add_argument("--total-tokens", type=positive_int, help="dynamic tree nodes incl. root (default: 8 / 16)")
    p.add_argument("--repeats", type=positive_int, default=3)
    p.add_argument("--warmup", type=positive_int, default=1,
                   help="untimed runs of every method before the timed ones (compiled rows compile here)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=positive_int, help="torch CPU threads (default: torch's own choice)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32",
                   help="weights of target and draft (bfloat16 for GPU runs; the tree scan accumulates in float32)")
    p.add_argument("--compile", action="store_true",
                   help="also run HF generate with a static cache + torch.compile (a baseline) and every speculative "
                   "row in compiled mode (the SSM target's verify and commit compiled, static KV for hybrids); "
                   "compile time is measured in the warm-up and reported apart")
    p.add_argument("--no-eager", action="store_true",
                   help="with --compile: no eager speculative rows (the eager AR baseline stays)")
    p.add_argument("--no-profile", action="store_true",
                   help="skip each speculative row's extra profiled run (the per-round time split; a compiled row's "
                   "compiles every part on its own)")
    p.add_argument("--out", default="benchmarks")
    p.add_argument("--name", help="report file stem prefix (default ssm-<scale>-<device>)")


def run_command(args, command: str) -> int:
    """`specmm bench ssm`: one report per target under --out."""
    from specmm import zoo
    from specmm.zoo import code, ssm_code

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    defaults = DEVICE_DEFAULTS["cpu" if device.type == "cpu" else "cuda"]
    for name in ("depth", "top_k", "total_tokens"):
        if getattr(args, name) is None:
            setattr(args, name, defaults[name])
    if args.no_eager and not args.compile:
        raise SystemExit("specmm bench ssm: --no-eager needs --compile (it leaves only the compiled rows)")
    static = STATIC_TREES[args.static_tree] if args.static_tree else defaults["static"]
    ssm_dir = zoo.build("ssm-code", args.scale)
    record = zoo.record("ssm-code", args.scale)
    dtype = DTYPES[args.dtype]
    code_draft = code.load(zoo.path("code", record["recipe"]["code_scale"]), device=device, dtype=dtype).draft
    drafts_dir = zoo.build("ssm-code-drafts", args.scale) if "distilled" in args.drafts else None
    dynamic = specmm.TreeSpec.dynamic(depth=args.depth, top_k=args.top_k, total_tokens=args.total_tokens)
    modes = ("eager",) if not args.compile else ("compiled",) if args.no_eager else ("eager", "compiled")
    setup = SSMBenchSetup(max_new_tokens=args.max_new_tokens, k=tuple(args.k or (defaults["k"],)),
                          static=specmm.TreeSpec.static(static), dynamic=dynamic, repeats=args.repeats,
                          warmup=args.warmup, modes=modes, profile=not args.no_profile)
    for role in args.targets:
        target, tokenizer, prompts = ssm_code.load(ssm_dir, role, device=device, dtype=dtype)
        if args.no_repeat_ngram_size:
            target.generation_config.no_repeat_ngram_size = args.no_repeat_ngram_size
        batch = tokenizer(prompts[: args.batch_size], return_tensors="pt", padding=True).to(device)
        setup.pad_token_id = tokenizer.pad_token_id
        info = record["models"][role]
        drafts, described = {}, {}
        if "code" in args.drafts:
            drafts["code"] = code_draft
            described["code draft"] = (f"zoo code-{record['recipe']['code_scale']} draft (Llama, "
                                       f"{sum(p.numel() for p in code_draft.parameters()) / 1e6:.2f}M params), greedy "
                                       f"agreement with this target {info['greedy_agreement_with_code_draft']:.2f}")
        if drafts_dir is not None:
            drafts["distilled"] = ssm_code.load_draft(drafts_dir, role, device=device, dtype=dtype)
            distilled = zoo.record("ssm-code-drafts", args.scale)["drafts"][role]
            described["distilled draft"] = (f"zoo ssm-code-drafts-{args.scale}/{role}: the code draft distilled onto "
                                            f"this target ({distilled['steps']} steps, forward KL), greedy agreement "
                                            f"{distilled['greedy_agreement']:.2f}, held-out KL "
                                            f"{distilled['heldout_kl_before']:.3f} -> {distilled['heldout_kl']:.3f}")
        models = {"target": f"zoo ssm-code-{args.scale}/{role}: {info['class']}, {info['parameters'] / 1e6:.2f}M "
                            f"params, held-out loss {info['heldout_loss']:.2f}",
                  **described, "dtype": args.dtype, "torch threads": torch.get_num_threads(),
                  "no_repeat_ngram_size": args.no_repeat_ngram_size or 0}
        notes = [("AR is HF's own greedy `generate`; every speculative row runs specmm's tree mixer (pure torch, "
                 "no Triton kernel) and must reproduce AR's tokens ('outputs match' compares them)."),
                 ("chain SD with replay rollback is the vanilla baseline (Snakes & Ladders-style activation replay); "
                 "STree rows commit the accepted node's SSM state in closed form from the verification tensors.")]
        if args.compile:
            notes.append("compiled rows: the SSM target's verify (tree layout, conv-window gather, tree scan, the "
                         "hybrid's attention over a static KV cache) and its state commit each run as one compiled "
                         "graph per tree shape and batch width, prefills eager; the draft compiles through the core. "
                         "The compiled AR row is HF `generate` with `cache_implementation='static'` and its decode "
                         "step compiled by HF itself (transformers 5.x gives these models static caches).")
        stem = f"{args.name or f'ssm-{args.scale}-{device.type}'}-{role}"
        report, _ = bench_ssm(target, drafts, batch["input_ids"], batch["attention_mask"], setup,
                              name=f"specmm bench ssm ({role})", command=command, models=models, notes=notes,
                              checkpoint=lambda partial: partial.write(args.out, stem))
        print(f"\n{report.name}\n{report.table()}")
        json_path, md_path = report.write(args.out, stem)
        print(f"wrote {json_path} and {md_path}")
    return 0
