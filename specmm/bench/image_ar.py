"""`specmm bench image_ar`: AR vs exact SD, SJD, LANTERN, LANTERN++ and GSD on the zoo `imagegen` model.

Every method samples the same class list with the same per-image seeds, at each batch size, in one process, the
methods taking turns batch by batch (a drift in the machine's speed hits every method alike; each batch's results
are saved, so `--resume` continues after the last saved batch).
Columns: step compression (image tokens per target forward, the condition prefill counted), latency ratio
to AR at the same batch size, FID / KID against a second AR sample set of the same size (the AR row is the
AR-vs-AR noise floor), class accuracy of the zoo's timm classifier, and the TV mass LANTERN/GSD moved per
accepted draft. A greedy (T=0) run checks that the lossless methods reproduce AR's tokens exactly.

`--compile` adds every method again in compiled mode (`ImageSampler(compile=True)`), the compiled AR row being a
second plain-decoding baseline: `speedup vs best AR` compares each row with the faster AR row of its batch size.
Compiled rows first run an untimed warm-up (one batch of each size the timed run meets), where they compile; its
compile seconds are reported apart. With `--compile`, speculative rows (eager and compiled) also get a per-round
time split from one more untimed, profiled batch.
"""

from __future__ import annotations

import json
import shlex
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import Tensor
from tqdm.auto import tqdm

from specmm.bench.compile_watch import CompileWatch
from specmm.bench.harness import BenchReport, BenchRow, compare_with_best_ar, round_ms
from specmm.core.tree import TreeSpec
from specmm.jobs import Job, atomic_save_image, atomic_write_text, atomic_writer
from specmm.machine import machine_info

LOSSLESS = ("exact", "sjd")
DRAFT_TREE_METHODS = ("exact", "lantern", "gsd-drafter")  # the rows --draft-chain applies to
RELAXED_METHODS = ("lantern", "lantern++", "gsd", "gsd-drafter")  # rows that report the mass they move


def _sample_chunk(sampler, chunk: list[int], start: int, seed: int, sampling: dict, device):
    """One batch of the set: images start.. with their own per-image seeds (the same for every method)."""
    gens = [torch.Generator(device=device).manual_seed(seed * 1_000_003 + start + i) for i in range(len(chunk))]
    return sampler.sample(torch.tensor(chunk), generator=gens, **sampling)


@dataclass
class _Batch:
    """What one batch of a set contributes (a `SampleResult`'s images, tokens and stats, on the CPU)."""

    images: list
    tokens: Tensor
    forwards: int
    seconds: float
    moved: float
    drafts: int

    @classmethod
    def of(cls, res) -> _Batch:
        return cls(res.images, res.tokens.cpu(), res.stats.row_forwards, res.stats.wall_time_s, res.stats.moved_mass,
                   res.stats.accepted_drafts)

    def state(self) -> dict:
        """For `torch.save`: the images as one uint8 tensor [n, H, W, 3]."""
        return {"images": torch.stack([torch.from_numpy(np.array(image)) for image in self.images]),
                "tokens": self.tokens, "forwards": self.forwards, "seconds": self.seconds, "moved": self.moved,
                "drafts": self.drafts}

    @classmethod
    def from_state(cls, state: dict) -> _Batch:
        return cls(**{**state, "images": [Image.fromarray(array.numpy()) for array in state["images"]]})


def _summary(batches: list[_Batch]) -> dict:
    """One set's totals over its batches: images, tokens, step compression, seconds, TV moved per accepted draft."""
    all_tokens = torch.cat([b.tokens for b in batches])
    return {"images": [image for b in batches for image in b.images], "tokens": all_tokens,
            "compression": all_tokens.numel() / sum(b.forwards for b in batches),
            "seconds": sum(b.seconds for b in batches),
            "moved": sum(b.moved for b in batches) / max(sum(b.drafts for b in batches), 1)}


def _sample_set(sampler, classes: list[int], batch_size: int, seed: int, sampling: dict, device) -> dict:
    starts = range(0, len(classes), batch_size)
    return _summary([_Batch.of(_sample_chunk(sampler, classes[s: s + batch_size], s, seed, sampling, device))
                     for s in starts])


def _interleaved_sets(samplers: dict, classes: list[int], batch_size: int, seed: int, sampling: dict, device,
                      watches: dict[str, CompileWatch], progress: Path) -> dict[str, dict]:
    """Every sampler over the same classes and per-image seeds, batch by batch in turn, so that a drift in the
    machine's speed hits every method alike. Each batch's results are saved to `progress/<start>.pt` (atomically);
    a resumed run reads them back and continues after the last saved batch."""
    sets, first = {key: [] for key in samplers}, 0
    for path in sorted(progress.glob("*.pt")) if progress.is_dir() else []:
        saved = torch.load(path, weights_only=True)
        if int(path.stem) != first or not set(samplers) <= set(saved):
            break  # a gap or another set of methods: the rest is redone
        for key in samplers:
            sets[key].append(_Batch.from_state(saved[key]))
        first += batch_size
    starts = range(first, len(classes), batch_size)
    for start in tqdm(starts, desc=f"bench image_ar bs{batch_size}: batches", disable=len(starts) < 2):
        batch = {}
        for key, sampler in samplers.items():
            with watches[key]:
                res = _sample_chunk(sampler, classes[start: start + batch_size], start, seed, sampling, device)
            batch[key] = _Batch.of(res)
            sets[key].append(batch[key])
        progress.mkdir(parents=True, exist_ok=True)
        with atomic_writer(progress / f"{start:07d}.pt") as f:
            torch.save({key: b.state() for key, b in batch.items()}, f)
    return {key: _summary(batches) for key, batches in sets.items()}


def _warm_up(sampler, classes: list[int], batch_size: int, sampling: dict, device) -> None:
    """One untimed batch of every size `_sample_set` meets (compiled rows compile here, never in a timed run)."""
    sizes = sorted({len(classes[s: s + batch_size]) for s in range(0, len(classes), batch_size)})
    for size in sizes:
        gens = [torch.Generator(device=device).manual_seed(i) for i in range(size)]
        sampler.sample(torch.tensor(classes[:size]), generator=gens, decode=False, **sampling)


def _round_split(sampler, classes: list[int], batch_size: int, sampling: dict, device) -> dict[str, float]:
    """ms per round in each phase, from one untimed profiled batch ({} for AR, which has no rounds)."""
    if sampler.proposer is None:
        return {}
    sampler.profile = True
    try:
        gens = [torch.Generator(device=device).manual_seed(i) for i in range(min(batch_size, len(classes)))]
        stats = sampler.sample(torch.tensor(classes[: len(gens)]), generator=gens, decode=False, **sampling).stats
    finally:
        sampler.profile = False
    return round_ms(stats)


def draft_chains(lengths: list[int] | None, batch_sizes: list[int]) -> dict[int, TreeSpec | None]:
    """--draft-chain: one chain length for every batch size or one per batch size -> {batch size: chain or None}
    (None: the sampler's dynamic tree). A verify costs more per token at larger batches, so shorter chains pay there."""
    if not lengths:
        return dict.fromkeys(batch_sizes)
    if len(lengths) not in (1, len(batch_sizes)) or min(lengths) < 1:
        raise ValueError(f"--draft-chain: one length >= 1, or one per batch size ({len(batch_sizes)}: "
                         f"{' '.join(map(str, batch_sizes))}); got {' '.join(map(str, lengths))}")
    per_size = lengths * len(batch_sizes) if len(lengths) == 1 else lengths
    return {bs: TreeSpec.chain(n) for bs, n in zip(batch_sizes, per_size)}


def _chain_text(chains: dict[int, TreeSpec]) -> str:
    """'a chain of 6 tokens', or per batch size 'a chain of 6 tokens at batch 1, of 3 tokens at batch 8'."""
    depths = [tree.depth for tree in chains.values()]
    if len(set(depths)) == 1:
        return f"a chain of {depths[0]} tokens"
    return "a chain " + ", ".join(f"of {tree.depth} tokens at batch {bs}" for bs, tree in chains.items())


def bench_image_ar(args) -> int:
    if args.model:  # a stock generator folder (Janus-Pro) against its own generate
        from specmm.bench.image_stock import bench_stock_images

        return bench_stock_images(args)
    if args.latent_size is not None:
        raise ValueError("--latent-size: for a stock generator folder (--model); the zoo imagegen has one size")
    from specmm import zoo
    from specmm.image_ar.compiled import compile_failures
    from specmm.image_ar.images import image_grid
    from specmm.image_ar.methods import METHODS, make_sampler
    from specmm.image_ar.sampler import DRAFTER_TREE
    from specmm.image_ar.metrics import accuracy, fid, kid
    from specmm.zoo import imagegen

    # drafter rows (exact SD with the drafter, LANTERN, GSD over the drafter) draft a chain per batch size, else the
    # dynamic tree; a bad --draft-chain is an error before any model loads
    chains = draft_chains(args.draft_chain, args.batch_sizes)
    methods = args.methods.split(",") if args.methods else list(METHODS)
    unknown = [m for m in methods if m not in METHODS]
    if unknown or methods[0] != "ar":
        raise ValueError(f"--methods: comma-separated, starting with ar, from {', '.join(METHODS)}; "
                         f"got {args.methods!r}")
    device = torch.device(args.device)
    variants = [(m, False) for m in methods] + ([(m, True) for m in methods] if args.compile else [])
    models = imagegen.load(zoo.build("imagegen", args.scale), device, args.dtype)
    record = zoo.record("imagegen", args.scale)
    lg, drafter, judge = models.lg, models.drafter, models.judge
    classes = [i % len(models.classes) for i in range(args.images)]
    labels = torch.tensor(classes)
    temperature = 1.0 if args.temperature is None else args.temperature
    top_k = 100 if args.top_k is None else args.top_k
    sampling = {"cfg_scale": args.cfg_scale, "temperature": temperature, "top_k": top_k, "top_p": 1.0}
    knobs = {"window": args.window, "delta": args.delta, "lam": args.lam, "lantern_k": args.lantern_k,
             "lantern_pp_k": args.lantern_pp_k, "gsd_window": args.gsd_window,
             "gsd_p_gap": args.gsd_gap, "gsd_quantile": args.gsd_quantile}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = args.name or f"image_ar-imagegen-{args.scale}-{device.type}"
    partial = out / f"{stem}.partial"  # rows (JSON) and AR reference features so far: --resume continues
    settings = {"scale": args.scale, "methods": methods, "images": args.images, "batch_sizes": args.batch_sizes,
                "seed": args.seed, "compile": bool(args.compile), "draft_chain": args.draft_chain, **sampling, **knobs,
                "dtype": str(args.dtype)}
    # the partial rows are a job: --resume continues only the same benchmark, a second run on it is refused
    with Job(partial, "bench image_ar", settings, resume=args.resume, force=not args.resume, folder=True,
             owned=("rows.json", "ref.pt", "progress-bs*/*.pt"), argument="--name"):
        done = {"rows": {}, "ref": {}}
        if args.resume and (partial / "ref.pt").is_file():  # written before any row that needs it
            done["ref"] = {int(k): v for k, v in torch.load(partial / "ref.pt", weights_only=True).items()}
        if args.resume and (partial / "rows.json").is_file():
            done["rows"] = {k: BenchRow(**v) for k, v in json.loads((partial / "rows.json").read_text()).items()}
        notes = []
        for batch_size in args.batch_sizes:
            if batch_size not in done["ref"]:
                reference = _sample_set(make_sampler(lg, "ar"), classes, batch_size, args.seed + 1, sampling, device)
                done["ref"][batch_size] = judge(reference["images"])[0]
                partial.mkdir(exist_ok=True)
                with atomic_writer(partial / "ref.pt") as f:
                    torch.save({str(k): v for k, v in done["ref"].items()}, f)
            ref_feats = done["ref"][batch_size]
            todo = [(m, c) for m, c in variants if _key(m, c, batch_size) not in done["rows"]]
            if not todo:  # a resumed run that finished this batch size
                continue
            trees = {m: chains[batch_size] if m in DRAFT_TREE_METHODS else None for m, _ in todo}
            samplers = {_key(m, c, batch_size): make_sampler(lg, m, drafter, compile=c, tree=trees[m], **knobs)
                        for m, c in todo}
            warms = {key: CompileWatch() for key in samplers}
            timed = {key: CompileWatch() for key in samplers}
            for (method, compiled), key in zip(todo, samplers):
                if compiled:  # every compiled row compiles before any timed batch
                    with warms[key]:
                        _warm_up(samplers[key], classes, batch_size, sampling, device)
            runs = _interleaved_sets(samplers, classes, batch_size, args.seed, sampling, device, timed,
                                     partial / f"progress-bs{batch_size}")
            for method, compiled in tqdm(todo, desc=f"bench image_ar bs{batch_size}: metrics"):
                key = _key(method, compiled, batch_size)
                first = method == "ar" and not compiled
                base_seconds = None if first else done["rows"][f"ar (bs {batch_size})"].median_s
                sampler, run, warm = samplers[key], runs[key], warms[key]
                split = _round_split(sampler, classes, batch_size, sampling, device) if args.compile else {}
                feats, logits = judge(run["images"])
                base_seconds = base_seconds or run["seconds"]
                kid_mean, kid_std = kid(feats, ref_feats, subsets=50,
                                        subset_size=max(2, min(50, 2 * len(classes) // 3)))
                matched = None
                if method in LOSSLESS:  # greedy check on one batch: identical tokens to greedy AR
                    greedy = {**sampling, "temperature": 0.0}
                    check = classes[:batch_size]
                    ar = make_sampler(lg, "ar").sample(torch.tensor(check), **greedy, decode=False).tokens
                    matched = torch.equal(sampler.sample(torch.tensor(check), **greedy, decode=False).tokens, ar)
                tokens = run["tokens"].numel()
                done["rows"][key] = BenchRow(
                    method=key, tokens_per_s=tokens / run["seconds"],
                    speedup=base_seconds / run["seconds"], mean_accepted=run["compression"], matched=matched,
                    new_tokens=tokens, median_s=run["seconds"], baseline=method == "ar",
                    compiled=compiled and not compile_failures(lg.gpt, drafter and drafter.head),
                    compile_s=warm.seconds,
                    timed_compiles=timed[key].events, round_ms=split,
                    extra={"FID": f"{fid(feats, ref_feats):.2f}", "KID": f"{kid_mean:.4f} ± {kid_std:.4f}",
                           "class acc": f"{accuracy(logits, labels):.2f}",
                           "TV moved/accepted draft": f"{run['moved']:.3f}" if method in RELAXED_METHODS
                           else "-"})
                atomic_write_text(partial / "rows.json", json.dumps({k: asdict(v) for k, v in done["rows"].items()}))
                if batch_size == args.batch_sizes[0] and not compiled:
                    grid = out / f"{stem}-grid-{method.replace('+', 'p')}.png"
                    atomic_save_image(image_grid(run["images"][: 4 * len(models.classes)], len(models.classes)), grid)
        notes += [
            ("mean accepted = step compression: image tokens per target forward per row (the condition prefill that "
            "samples token 0 counts as a forward; AR = 1.00)."),
            ("speedup = AR wall time / method wall time at the same batch size (one run each, same classes and "
            "per-image seeds; CPU timings on a shared machine are noisy)."),
            "outputs match: greedy (T=0) tokens of one batch equal greedy AR's (lossless methods only); n/a for lossy.",
            ("FID/KID: features of the zoo's timm classifier, each method's set against a second AR set of the same "
            "size (other seeds); the AR row is the AR-vs-AR noise floor. KID: unbiased MMD^2 (can be negative), "
            "mean ± std over 50 random subsets of 2/3 of each set; FID on fewer images than feature dimensions is "
            "dominated by estimation noise."),
            (f"LANTERN / LANTERN++ / exact SD / gsd-drafter use the zoo image drafter (heldout top-1 agreement "
            f"{record['drafter']['heldout_top1_agreement']:.2f}); SJD and GSD use Jacobi windows of {args.window}."),
            (f"exact SD, LANTERN and gsd-drafter draft {_chain_text(chains)}" if args.draft_chain else
             f"exact SD, LANTERN and gsd-drafter draft the dynamic tree (depth {DRAFTER_TREE.depth}, "
             f"top-k {DRAFTER_TREE.top_k}, "
             f"{DRAFTER_TREE.total_tokens} nodes)") +
            "; LANTERN++ its upstream `naive_extend_57` tree.",
        ]
        setup = {"model": f"zoo imagegen-{args.scale}: LlamaGen c2i GPT {record['gpt']['parameters']} params, "
                 f"{record['tokens_per_image']} tokens per {record['image_size']} px image, "
                 f"{lg.config.vocab_size} codes", "images per method": args.images,
                 "sampling": f"T={temperature:g}, top-k {top_k}, cfg {args.cfg_scale}", "knobs": knobs,
                 "classifier accuracy on held-out real images": record["classifier"]["heldout_accuracy"],
                 "device": str(device), "GPT and drafter dtype": str(args.dtype)}
        command = "specmm " + " ".join(shlex.quote(a) for a in sys.argv[1:])
        if args.compile:
            notes.append("compiled rows: `ImageSampler(compile=True)` (verify, commit, drafts and acceptance compiled "
                         "with static shapes over LlamaGen's static caches, one host sync per round); 'ar, compiled' "
                         "is plain AR decoding of the same target through the same static cache and compiled verify. "
                         "compile s: seconds compiling in the row's warm-up, never inside its timed run.")
        rows = [done["rows"][_key(m, c, b)] for b in args.batch_sizes for m, c in variants]
        for b in args.batch_sizes:  # each batch size against its fastest AR row (eager, or compiled with --compile)
            compare_with_best_ar([done["rows"][_key(m, c, b)] for m, c in variants])
        report = BenchReport(name=f"image_ar on zoo imagegen-{args.scale} ({device.type})", command=command, rows=rows,
                             setup=setup, notes=notes, machine=machine_info(device),
                             created=time.strftime("%Y-%m-%d %H:%M:%S"))
        print(report.table())
        json_path, md_path = report.write(out, stem)
        print(f"wrote {json_path} and {md_path}")
    shutil.rmtree(partial, ignore_errors=True)
    return 0


def _key(method: str, compiled: bool, batch_size: int) -> str:
    return f"{method}{', compiled' if compiled else ''} (bs {batch_size})"


def add_parser(bsub) -> None:
    p = bsub.add_parser("image_ar", help="AR vs exact SD / SJD / LANTERN / LANTERN++ / GSD on zoo imagegen, or a "
                                          "stock generator folder (--model DIR, e.g. Janus-Pro) against its generate")
    p.add_argument("--scale", default="cpu")
    p.add_argument("--model", help="stock image generator folder (model + processor): bench against its own generate")
    p.add_argument("--latent-size",  # HxW: the CLI sets its type
                   help="with --model, for generators of any size (Emu3): HxW latent tokens (default: the processor's)")
    p.add_argument("--prompts", help="with --model: text file, one prompt per line (default: four built-in prompts)")
    p.add_argument("--repeats", type=int, default=1, help="with --model: timed runs per method (median)")
    p.add_argument("--dtype", default="float32", help="weights dtype: the stock model's (--model), else the zoo GPT's "
                   "and its drafter's (the VQ and the judge stay float32)")
    p.add_argument("--methods", help="comma-separated, starting with ar (default: ar,exact,sjd,lantern,lantern++,gsd,"
                   "gsd-drafter)")
    p.add_argument("--images", type=int, default=40, help="images per method and batch size")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    p.add_argument("--cfg-scale", type=float, default=2.0)
    p.add_argument("--temperature", type=float,
                   help="sampling temperature (default: 1 on the zoo; 0, greedy, with --model, where a sampled run "
                        "checks each lossless row's greedy tokens against HF generate's)")
    p.add_argument("--top-k", type=int, help="top-k sampling, 0 off (default: 100 on the zoo, off with --model)")
    p.add_argument("--window", type=int, default=16)
    p.add_argument("--delta", type=float, default=0.2)
    p.add_argument("--lam", type=float, default=5.0)
    p.add_argument("--lantern-k", type=int, default=32)
    p.add_argument("--lantern-pp-k", type=int, default=10)
    p.add_argument("--draft-chain", type=int, nargs="+",
                   help="exact SD (with the drafter), LANTERN and gsd-drafter draft a chain of this many tokens "
                        "instead of the sampler's dynamic tree; one length, or one per batch size (e.g. 6 3 with "
                        "--batch-sizes 1 8: a verify costs more per token at larger batches); LANTERN++ keeps its "
                        "own tree")
    p.add_argument("--gsd-window", type=int, default=14)
    p.add_argument("--gsd-gap", type=float, default=0.15, help="GSD: max |p(y) - p(x)| inside a group")
    p.add_argument("--gsd-quantile", type=float, default=0.05,
                   help="GSD: embedding-distance bound = this quantile of codebook pair distances")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compile", action="store_true",
                   help="also run every method compiled (ImageSampler(compile=True)), with a compiled AR baseline; "
                        "compile time is measured in each row's warm-up and reported apart")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", default="benchmarks")
    p.add_argument("--name")
    p.add_argument("--resume", action="store_true", help="keep the rows of an interrupted run with the same --name")
