"""`specmm bench image_ar --model DIR`: a stock image generator folder (Janus-Pro, Emu3) against its own `generate`.

One process, the same prompts, greedy decoding by default (T=0), so every row's tokens can be compared with HF's,
or sampled (`--temperature`, `--top-k`: what acceptance is in use, SJD's case), where each lossless row's greedy
tokens of the same batch are checked against HF's instead. HF's image `generate` is the reference row (with
`--compile` also HF's static cache with the decode step compiled: the fastest plain decoding a user of the stock
model gets); specmm's AR, exact SD and SJD (Jacobi windows) and GSD run through `ImageSampler.for_model`.
Columns: step compression (image tokens per target forward) and latency against HF's own loop at the same shapes
(`overhead efficiency` = speedup over HF / step compression: specmm's per-step cost relative to HF's, 1.0 meaning
none).
"""

from __future__ import annotations

import json
import shlex
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from specmm.bench.fast_path import hf_compile_scope, hf_compiled, hf_static_compile_kwargs
from specmm.bench.harness import BenchReport, BenchRow, Method, RunResult, run_benchmark
from specmm.jobs import Job, atomic_write_text, fingerprint
from specmm.machine import machine_info

STOCK_METHODS = ("ar", "exact", "sjd", "gsd")  # lantern(++) need a trained drafter
LOSSLESS = ("ar", "exact", "sjd")
DEFAULT_PROMPTS = ["a red cat on the mat", "a blue dog under the big tree", "green sky", "a small tree"]
HF_COMPILED = ("HF's image generate with its decode step compiled over a static cache (Emu3: generate's static "
               "cache and auto-compile, prefill eager; Janus: its own static cache, the language model compiled)")
RANDOM_WEIGHTS = ("Acceptance depends on the weights: on a tiny random model (as in the tests) step compression is "
                  "meaningless; only the latency columns (specmm's per-step overhead against HF's loop) mean "
                  "something there. Run a real checkpoint for acceptance figures.")


def bench_stock_images(args) -> int:
    """Every method (and HF's rows) per batch size, interleaved; the report is written after each batch size, whose
    rows are kept in `<name>.partial/` so `--resume` continues after the last finished one."""
    from specmm.image_ar.methods import make_sampler
    from specmm.image_ar.models import image_model_for, load_pretrained

    methods = args.methods.split(",") if args.methods else list(STOCK_METHODS)
    unknown = [m for m in methods if m not in STOCK_METHODS]
    if unknown:
        raise ValueError(f"--methods: with --model, comma-separated from {', '.join(STOCK_METHODS)}; "
                         f"got {args.methods!r}")
    prompts = DEFAULT_PROMPTS
    if args.prompts:
        prompts = [line for line in Path(args.prompts).read_text(encoding="utf-8").splitlines() if line.strip()]
        if not prompts:
            raise ValueError(f"--prompts: {args.prompts} holds no prompt (one per line)")
    device = torch.device(args.device)
    sampling = {"temperature": args.temperature or 0.0, "top_k": args.top_k or 0, "seed": args.seed}
    model, processor = load_pretrained(args.model, args.dtype, device, args.latent_size)
    image = image_model_for(model, processor, latent_size=args.latent_size)
    if not callable(getattr(image, "hf_generate", None)):
        raise ValueError(f"--model: the {type(image).__name__} adapter has no hf_generate (the HF generate call it "
                         "reproduces), so there is no reference row to bench against")
    problem = image.hf_generate_problem() if callable(getattr(image, "hf_generate_problem", None)) else None
    if problem:
        raise ValueError(f"--model: {problem}")
    knobs = {"window": args.window, "gsd_window": args.gsd_window, "gsd_p_gap": args.gsd_gap,
             "gsd_quantile": args.gsd_quantile}
    stem = args.name or f"image_ar-{type(model).__name__}-{device.type}"
    partial = Path(args.out) / f"{stem}.partial"
    settings = {"model": fingerprint(args.model), "prompts": prompts, "latent_size": args.latent_size,
                "methods": methods, "batch_sizes": args.batch_sizes, "cfg_scale": args.cfg_scale,
                "compile": bool(args.compile), "repeats": args.repeats, "dtype": str(args.dtype), **knobs, **sampling}
    done: dict[str, list[dict]] = {}  # batch size -> its rows
    # the kept rows are a job: --resume continues only the same benchmark, a second run on it is refused
    with Job(partial, "bench image_ar --model", settings, resume=args.resume, force=not args.resume, folder=True,
             owned=("rows.json",), argument="--name"), hf_compile_scope(model):
        if args.resume and (partial / "rows.json").is_file():
            done = json.loads((partial / "rows.json").read_text(encoding="utf-8"))
        for batch_size in args.batch_sizes:
            if str(batch_size) in done:  # finished before the run was interrupted
                continue
            batch = [prompts[i % len(prompts)] for i in range(batch_size)]
            hf_eager = _hf_runner(model, image, batch, args.cfg_scale, sampling)
            bench = [Method(f"hf generate (bs {batch_size})", hf_eager, baseline=True)]
            if args.compile:
                bench.append(Method(f"hf generate, static cache + torch.compile (bs {batch_size})",
                                    _hf_runner(model, image, batch, args.cfg_scale, sampling, compiled=True),
                                    baseline=True, compiled=True, note=HF_COMPILED))
            samplers = {}
            for method in methods:
                for compiled in (False, True) if args.compile else (False,):
                    sampler = make_sampler(image, method, compile=compiled, **knobs)
                    name = f"{method}{', compiled' if compiled else ''} (bs {batch_size})"
                    samplers[name] = method, sampler
                    bench.append(Method(name, _runner(sampler, batch, args.cfg_scale, sampling), compiled=compiled))
            timed, _ = run_benchmark(bench, device, repeats=args.repeats, warmup=1)
            if sampling["temperature"] > 0:
                _greedy_check(timed, samplers, image, batch, args.cfg_scale)
            done[str(batch_size)] = [asdict(row) for row in timed]
            atomic_write_text(partial / "rows.json", json.dumps(done))
            left = [bs for bs in args.batch_sizes if str(bs) not in done]
            if left:
                _report(args, model, image, prompts, knobs, device, done, stem,
                        f"batch sizes {', '.join(map(str, left))} not run yet")
    _report(args, model, image, prompts, knobs, device, done, stem, "")
    shutil.rmtree(partial, ignore_errors=True)
    return 0


def _report(args, model, image, prompts: list[str], knobs: dict, device: torch.device, done: dict, stem: str,
            partial: str) -> None:
    """Write (and print) the report of the rows in `done`, in `--batch-sizes` order."""
    rows = [BenchRow(**row) for bs in args.batch_sizes for row in done.get(str(bs), [])]
    text = model.config.get_text_config()
    setup = {"model": f"{type(model).__name__} from {args.model}: {sum(p.numel() for p in model.parameters())} params, "
             f"{text.num_hidden_layers} layers, {image.tokens_per_image} tokens per image, "
             f"{image.target.vocab_size} codes", "prompts": len(prompts), "sampling": _sampling_text(args),
             "knobs": knobs, "device": str(device), "dtype": str(args.dtype)}
    notes = [RANDOM_WEIGHTS,
             "mean accepted = step compression: image tokens per target forward per row (the prompt prefill that gives "
             "token 0 counts as a forward; HF generate and AR = 1.00).",
             "speedup = HF generate's wall time / the method's at the same batch size (median of the repeats).",
             ("outputs match: greedy tokens equal HF generate's (exact SD, SJD and AR must; GSD is lossy)." if not
              args.temperature else "outputs match: sampled rows are not expected to equal HF's draws; each lossless "
              "row (AR, exact SD, SJD) is checked by its greedy tokens of the same batch against HF generate's "
              "greedy ones (n/a: HF's rows and GSD). Losslessness in law is tested by chi-square tests in "
              "tests/image_ar."),
             f"SJD and GSD use Jacobi windows of {args.window}."]
    if args.compile:
        notes.append("compiled rows: `ImageSampler(compile=True)`, the model's forwards compiled over a static cache "
                     "(CUDA graphs on CUDA); they compile in the warm-up run, never inside a timed one. "
                     f"HF compiled row: {HF_COMPILED}.")
    report = BenchReport(name=f"image_ar on {type(model).__name__} ({device.type})",
                         command="specmm " + " ".join(shlex.quote(a) for a in sys.argv[1:]), rows=rows, setup=setup,
                         notes=notes, machine=machine_info(device), created=time.strftime("%Y-%m-%d %H:%M:%S"),
                         partial=partial)
    if not partial:
        print(report.table())
        print(RANDOM_WEIGHTS)
    json_path, md_path = report.write(args.out, stem)
    print(f"wrote {json_path} and {md_path}{' (partial: ' + partial + ')' if partial else ''}")


def _sampling_text(args) -> str:
    if not args.temperature:
        return f"greedy, cfg {args.cfg_scale}"
    return f"T={args.temperature:g}, top-k {args.top_k or 'off'}, cfg {args.cfg_scale}, seed {args.seed}"


def _hf_options(sampling: dict) -> dict:
    """`generate`'s sampling options for `sampling` (top-k 0 is off; passed, so the checkpoint's default is not)."""
    if not sampling["temperature"]:
        return {"do_sample": False}
    return {"do_sample": True, "temperature": sampling["temperature"], "top_k": sampling["top_k"], "top_p": 1.0}


def _hf_runner(model, image, prompts: list[str], cfg_scale: float, sampling: dict, compiled: bool = False):
    """HF's own image `generate` (the adapter's `hf_generate`), eager or compiled: Emu3 through `generate`'s static
    cache and auto-compile; Janus's image loop calls its language model directly (a static cache of its own, no
    auto-compile), so that module is called through `torch.compile` for the run. Sampled runs reseed torch's
    global generator (HF's) first, so every run draws alike."""
    janus = type(model).__name__ == "JanusForConditionalGeneration"
    options = {**(hf_static_compile_kwargs(model) if compiled else {}), **_hf_options(sampling)}
    compiled_lm = (torch.compile(model.model.language_model._call_impl, **options["compile_config"].to_dict())
                   if compiled and janus else None)

    def run() -> RunResult:
        torch.manual_seed(sampling["seed"])
        if not janus:
            tokens = image.hf_generate(prompts, cfg_scale, **options)
            return RunResult(rows=tokens.tolist(), mean_accepted=1.0, compiled=compiled and hf_compiled(model))
        lm = model.model.language_model
        lm._compiled_call_impl = compiled_lm  # nn.Module.compile's hook: calls go through it while set
        try:
            tokens = image.hf_generate(prompts, cfg_scale, **_hf_options(sampling))
        finally:
            lm._compiled_call_impl = None
        return RunResult(rows=tokens.tolist(), mean_accepted=1.0, compiled=compiled)

    return run


def _runner(sampler, prompts: list[str], cfg_scale: float, sampling: dict):
    """specmm's run: greedy, or sampled with one generator per row seeded by its place (the same draws each run)."""
    def run() -> RunResult:
        generators = None
        if sampling["temperature"]:
            device = sampler.target.device
            generators = [torch.Generator(device).manual_seed(sampling["seed"] + i) for i in range(len(prompts))]
        out = sampler.sample(prompts, cfg_scale=cfg_scale, temperature=sampling["temperature"],
                             top_k=sampling["top_k"], generator=generators, decode=False)
        return RunResult(rows=out.tokens.tolist(), mean_accepted=out.stats.step_compression, stats=out.stats)

    return run


def _greedy_check(rows: list[BenchRow], samplers: dict, image, prompts: list[str], cfg_scale: float) -> None:
    """Sampled rows: `matched` is whether each lossless row's greedy tokens of the same batch equal HF generate's
    greedy ones (None for HF's rows and GSD, whose draws are not expected to match)."""
    reference = None
    for row in rows:
        method, sampler = samplers.get(row.method, (None, None))
        row.matched = None
        if row.error or method not in LOSSLESS:
            continue
        if reference is None:
            reference = image.hf_generate(prompts, cfg_scale, do_sample=False).tolist()
        greedy = sampler.sample(prompts, cfg_scale=cfg_scale, temperature=0.0, decode=False).tokens.tolist()
        row.matched = greedy == reference


__all__ = ["bench_stock_images"]
