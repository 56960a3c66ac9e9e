"""`specmm bench ssm`: AR vs chain SD with replay rollback vs STree (static and dynamic trees) on SSM targets.

Per target (the zoo's Mamba2 and Bamba hybrid), side by side in one process on the same left-padded prompts:
HF `generate` (greedy, batched) as the AR baseline; chain speculative decoding whose SSM states roll back by
replaying the accepted inputs (the vanilla method); STree, i.e. tree verification with closed-form state
commits, on a static and a dynamic tree. The drafter is the `code` entry's small Llama.

With `compile=True` the speculative rows run the core's compiled mode. The SSM target adapter has no static-cache
path yet (a later issue), so the core warns and runs it eager while the draft model compiles: those rows record
`compiled=false` (the target did not compile) and name the parts that did.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

import specmm
from specmm.bench.core import _describe, new_token_rows, timing_note
from specmm.bench.fast_path import compiled_parts, describe_parts
from specmm.bench.harness import BenchReport, Method, RunResult, run_benchmark
from specmm.drafters import ModelDrafter
from specmm.machine import machine_info
from specmm.ssm import SSMTarget

STATIC_TREE = ((0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 0, 0, 0),
               (0, 0, 0, 1))  # 12 nodes with the root, depth 4 (STree's static trees are 12-18 nodes, depth 4)
SMALL_STATIC_TREE = ((0,), (1,), (0, 0), (1, 0), (0, 0, 0))  # 6 nodes, depth 3: on CPU verify cost grows with nodes
# Draft shapes per device (as in `specmm bench core`): on CPU every extra node and draft step costs visibly.
DEVICE_DEFAULTS = {"cpu": {"k": 2, "static": SMALL_STATIC_TREE, "depth": 3, "top_k": 2, "total_tokens": 8},
                   "cuda": {"k": 4, "static": STATIC_TREE, "depth": 5, "top_k": 4, "total_tokens": 16}}


@dataclass
class SSMBenchSetup:
    max_new_tokens: int = 64
    k: int = 4
    static: specmm.TreeSpec = field(default_factory=lambda: specmm.TreeSpec.static(STATIC_TREE))
    dynamic: specmm.TreeSpec = field(default_factory=lambda: specmm.TreeSpec.dynamic(depth=5, top_k=4,
                                                                                    total_tokens=16))
    pad_token_id: int = 0
    repeats: int = 3
    warmup: int = 1
    compile: bool = False  # speculative rows in the core's compiled mode (the SSM target itself stays eager)


def ssm_methods(target: nn.Module, draft: nn.Module, input_ids: Tensor, attention_mask: Tensor,
                setup: SSMBenchSetup) -> list[Method]:
    width, pad, new = input_ids.shape[1], setup.pad_token_id, setup.max_new_tokens

    def autoregressive() -> RunResult:
        out = target.generate(input_ids, attention_mask=attention_mask, do_sample=False, max_new_tokens=new,
                              min_new_tokens=new, pad_token_id=pad)
        return RunResult(new_token_rows(out, width, None, pad))

    def speculative(commit_mode: str, tree: specmm.TreeSpec):
        def run() -> RunResult:
            gen = specmm.SpeculativeGenerator(SSMTarget(target, commit_mode=commit_mode), ModelDrafter(draft),
                                              tree=tree, compile=setup.compile)
            out = gen.generate(input_ids, attention_mask=attention_mask, max_new_tokens=new, pad_token_id=pad)
            result = RunResult(new_token_rows(out.sequences, width, None, pad), out.stats.mean_accepted)
            if setup.compile:
                parts = compiled_parts(gen)
                result.compiled = "target" in parts  # only a target with a static path (`static_plan`) compiles
                result.extra = {"compiled parts": describe_parts(parts)}
            return result
        return run

    def row(name: str, run, note: str = "") -> Method:
        return Method(name, run, note=note, compiled=setup.compile)  # compiled drafts need the warm-up too

    chain = specmm.TreeSpec.chain(setup.k)
    return [
        Method(f"AR (HF generate, batch {input_ids.shape[0]})", autoregressive, baseline=True),
        row(f"chain SD k={setup.k}, replay rollback", speculative("replay", chain),
            note="vanilla SSM speculative decoding: re-scan the accepted inputs to roll the state forward"),
        row(f"chain SD k={setup.k}, closed-form commit", speculative("closed_form", chain)),
        row(f"STree {_describe(setup.static)}", speculative("closed_form", setup.static)),
        row(f"STree {_describe(setup.dynamic)}", speculative("closed_form", setup.dynamic)),
    ]


def bench_ssm(target: nn.Module, draft: nn.Module, input_ids: Tensor, attention_mask: Tensor,
              setup: SSMBenchSetup, *, name: str, command: str, models: dict, notes: list[str],
              progress: bool = True) -> tuple[BenchReport, dict[str, RunResult]]:
    """Run the SSM methods side by side on one target; returns the report and every method's outputs."""
    device = next(target.parameters()).device
    with torch.no_grad():
        rows, outputs = run_benchmark(ssm_methods(target, draft, input_ids, attention_mask, setup), device,
                                      repeats=setup.repeats, warmup=setup.warmup, progress=progress)
    info = {"batch": input_ids.shape[0], "prompt tokens (max)": input_ids.shape[1],
            "max_new_tokens": setup.max_new_tokens, "sampling": "greedy",
            "compiled mode": setup.compile, "timing": timing_note(setup), **models}
    report = BenchReport(name=name, command=command, rows=rows, setup=info, notes=notes, machine=machine_info(device))
    return report, outputs


# ------------------------------------------------------------------------------------------------ command line

def add_parser(bench_subparsers, positive_int) -> None:
    """Register `specmm bench ssm` on the `bench` subcommand's subparsers."""
    p = bench_subparsers.add_parser("ssm", help="SSM / hybrid targets: AR vs chain SD with replay vs STree trees")
    p.add_argument("--scale", default="cpu", help="zoo scale of ssm-code (and of the code draft)")
    p.add_argument("--targets", nargs="+", default=["mamba2", "hybrid"], choices=["mamba2", "hybrid"])
    p.add_argument("--batch-size", type=positive_int, default=4)
    p.add_argument("--max-new-tokens", type=positive_int, default=64)
    p.add_argument("--k", type=positive_int, help="chain length (default: 2 on CPU, 4 on CUDA)")
    p.add_argument("--depth", type=positive_int, help="dynamic tree depth (default: 3 on CPU, 5 on CUDA)")
    p.add_argument("--top-k", type=positive_int, help="dynamic tree branching (default: 2 on CPU, 4 on CUDA)")
    p.add_argument("--total-tokens", type=positive_int, help="dynamic tree nodes incl. root (default: 8 / 16)")
    p.add_argument("--repeats", type=positive_int, default=3)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=positive_int, help="torch CPU threads (default: torch's own choice)")
    p.add_argument("--compile", action="store_true",
                   help="speculative rows in compiled mode: the draft compiles; the SSM target has no static path "
                   "yet and stays eager (rows record compiled=false)")
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
    for name in ("k", "depth", "top_k", "total_tokens"):
        if getattr(args, name) is None:
            setattr(args, name, defaults[name])
    ssm_dir = zoo.build("ssm-code", args.scale)
    record = zoo.record("ssm-code", args.scale)
    draft = code.load(zoo.path("code", record["recipe"]["code_scale"]), device=device).draft
    setup = SSMBenchSetup(max_new_tokens=args.max_new_tokens, k=args.k, static=specmm.TreeSpec.static(defaults["static"]),
                          dynamic=specmm.TreeSpec.dynamic(depth=args.depth, top_k=args.top_k,
                                                          total_tokens=args.total_tokens), repeats=args.repeats,
                          compile=args.compile)
    for role in args.targets:
        target, tokenizer, prompts = ssm_code.load(ssm_dir, role, device=device)
        batch = tokenizer(prompts[: args.batch_size], return_tensors="pt", padding=True).to(device)
        setup.pad_token_id = tokenizer.pad_token_id
        info = record["models"][role]
        models = {"target": f"zoo ssm-code-{args.scale}/{role}: {info['class']}, {info['parameters'] / 1e6:.2f}M "
                            f"params, held-out loss {info['heldout_loss']:.2f}",
                  "draft": f"zoo code-{record['recipe']['code_scale']} draft (Llama, "
                           f"{sum(p.numel() for p in draft.parameters()) / 1e6:.2f}M params), greedy agreement "
                           f"with this target {info['greedy_agreement_with_code_draft']:.2f}",
                  "torch threads": torch.get_num_threads()}
        notes = [("AR is HF's own greedy `generate`; every speculative row runs specmm's tree mixer (pure torch, "
                 "no Triton kernel) and must reproduce AR's tokens ('outputs match' compares them)."),
                 ("chain SD with replay rollback is the vanilla baseline (Snakes & Ladders-style activation replay); "
                 "STree rows commit the accepted node's SSM state in closed form from the verification tensors.")]
        report, _ = bench_ssm(target, draft, batch["input_ids"], batch["attention_mask"], setup,
                              name=f"specmm bench ssm ({role})", command=command, models=models, notes=notes)
        print(f"\n{report.name}\n{report.table()}")
        json_path, md_path = report.write(args.out, f"{args.name or f'ssm-{args.scale}-{device.type}'}-{role}")
        print(f"wrote {json_path} and {md_path}")
    return 0
