"""Reference models specmm trains itself, on data any machine has, saved like users' checkpoints.

`build(name, scale)` trains an entry (resuming after a kill), checks it and records `zoo.json`; `path`
returns a finished build's folder, which loads with the usual `from_pretrained`.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from specmm.jobs import OutputLock
from specmm.machine import machine_info
from specmm.zoo import captioner, captioner_drafters, chainarith, code, code_drafts, cspd, dlm_code, imagegen, ssm_code
from specmm.zoo.store import (
    WORK,
    clear_artifacts,
    entry_dir,
    home,
    lock_path,
    problems,
    read_manifest,
    write_manifest,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ZooEntry:
    name: str
    description: str
    recipes: dict[str, dict]  # scale -> recipe (JSON-serialisable)
    build: Callable[[Path, dict, int, bool], dict]  # (dest, recipe, seed, progress) -> record
    version: int = 1  # bump when the recipe code changes what a build produces: older builds are rebuilt


REGISTRY: dict[str, ZooEntry] = {}


def register(entry: ZooEntry) -> None:
    REGISTRY[entry.name] = entry


register(ZooEntry("code", "Llama target + ~10x smaller Llama draft on the Python standard library source",
                  code.RECIPES, code.build, version=2))
register(ZooEntry("code-drafts", "an EAGLE head and a distilled draft for the code target (for bench core)",
                  code_drafts.RECIPES, code_drafts.build))
register(ZooEntry("captioner", "LLaVA (CLIP tower + Llama) describing procedural scenes, + text-only draft",
                  captioner.RECIPES, captioner.build, version=2))
register(ZooEntry("captioner-drafters", "every VisionDrafter method (eagle, msd, vispec, dream, flash) trained "
                  "against the captioner", captioner_drafters.RECIPES, captioner_drafters.build))
# what `specmm demo` needs on a first run: ViSpec alone, trained by the same code on fewer scenes and steps
register(ZooEntry("captioner-vispec", "the ViSpec drafter alone, a lighter captioner-drafters recipe for the demo",
                  captioner_drafters.only("vispec", scenes=256, text=dict(steps=80, lr=1e-3, warmup_steps=10,
                                          checkpoint_every=40), multimodal=dict(steps=220, lr=1e-3, warmup_steps=20,
                                          checkpoint_every=40)), captioner_drafters.build))
register(ZooEntry("ssm-code", "Mamba2 and Bamba-hybrid targets on the code corpus, drafted by the code draft",
                  ssm_code.RECIPES, ssm_code.build))
register(ZooEntry("ssm-code-drafts", "the code draft distilled onto each ssm-code target (forward KL, code corpus)",
                  ssm_code.DRAFT_RECIPES, ssm_code.build_drafts))
register(ZooEntry("imagegen", "class-conditional LlamaGen (VQ + GPT) on 10 procedural image classes, + image drafter "
                  "and timm classifier", imagegen.RECIPES, imagegen.build))
register(ZooEntry("chainarith", "ChainArith reasoning: Llama target with a trained self-judge, weaker draft, "
                  "Arbitrage router", chainarith.RECIPES, chainarith.build))
register(ZooEntry("cspd", "continuous-token AR target + smaller draft (per-token DDPM heads) on KL-VAE latents of the "
                  "class images, + FID/KID classifier", cspd.RECIPES, cspd.build))
register(ZooEntry("dlm-code", "masked diffusion LM in LLaDA's layout on the code corpus (for specmm bench dlm)",
                  dlm_code.RECIPES, dlm_code.build))


def get(name: str) -> ZooEntry:
    if name not in REGISTRY:
        raise ValueError(f"name: unknown zoo entry {name!r}; the entries: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[name]


def check(name: str, scale: str) -> ZooEntry:
    """The entry `name`, after checking (before any work) that it exists and has `scale`."""
    entry = get(name)
    _recipe(entry, scale)
    return entry


def _recipe(entry: ZooEntry, scale: str) -> dict:
    if scale not in entry.recipes:
        raise ValueError(f"scale: zoo entry {entry.name!r} has no scale {scale!r}; its scales: "
                         f"{', '.join(entry.recipes)}")
    return entry.recipes[scale]


def _problems(entry: ZooEntry, dest: Path, scale: str, seed: int, check_hashes: bool = True) -> list[str]:
    found = problems(dest, check_hashes)
    manifest = read_manifest(dest) or {}
    if not found and manifest.get("version", 1) != entry.version:
        found = [f"built by recipe version {manifest.get('version', 1)}, current is {entry.version}"]
    if not found and "recipe" in manifest and manifest["recipe"] != json.loads(json.dumps(entry.recipes[scale])):
        found = ["built from a different recipe"]
    if not found and manifest.get("seed", 0) != seed:
        found = [f"built with seed {manifest.get('seed', 0)}, not {seed}"]
    return found


def training_device(recipe) -> torch.device:
    """Where a recipe trains: the first `device` any of its training configs names (GPU recipes), else the CPU."""
    if isinstance(recipe, dict):
        if isinstance(recipe.get("device"), str):
            return torch.device(recipe["device"])
        for value in recipe.values():
            device = training_device(value)
            if device.type != "cpu":
                return device
    return torch.device("cpu")


def build(name: str, scale: str = "cpu", *, seed: int = 0, force: bool = False, progress: bool = True) -> Path:
    """Train `name` at `scale` with `seed` unless an intact, current build of that seed exists (each seed has its
    own folder); resumes from checkpoints after a kill. A second concurrent build of the same folder is refused
    (JobLockedError naming the builder's PID)."""
    entry = get(name)
    recipe = _recipe(entry, scale)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed: expected an integer >= 0, got {seed!r}")
    dest = entry_dir(name, scale, seed)
    if not force and not _problems(entry, dest, scale, seed):
        return dest
    with OutputLock(lock_path(dest), "zoo build", dest):
        issues = _problems(entry, dest, scale, seed)  # again under the lock: another builder may have finished
        if not force and not issues:
            return dest
        if force and dest.exists():
            shutil.rmtree(dest)
        elif dest.exists():
            logger.warning("rebuilding %s: %s", dest, "; ".join(issues))
            clear_artifacts(dest)
        dest.mkdir(parents=True, exist_ok=True)
        resumed = (dest / WORK).exists()
        started = time.perf_counter()
        record = entry.build(dest, recipe, seed, progress)
        record = {"name": name, "scale": scale, "version": entry.version, "seed": seed, "recipe": recipe, **record,
                  "wall_time_s": round(time.perf_counter() - started, 1), "resumed_from_checkpoint": resumed,
                  "machine": machine_info(training_device(recipe))}
        write_manifest(dest, record)
        shutil.rmtree(dest / WORK, ignore_errors=True)
    return dest


def path(name: str, scale: str = "cpu", *, seed: int = 0, verify: bool = False) -> Path:
    """Folder of a finished, intact build (FileNotFoundError with the build command otherwise). Sizes are always
    checked; `verify` also checks every file's sha256 against zoo.json, as `build` does (`specmm zoo path`)."""
    entry = get(name)
    _recipe(entry, scale)
    dest = entry_dir(entry.name, scale, seed)
    issues = _problems(entry, dest, scale, seed, check_hashes=verify)
    if issues:
        seed_flag = f" --seed {seed}" if seed else ""
        raise FileNotFoundError(f"zoo entry {name!r} ({scale}{f', seed {seed}' if seed else ''}) is not built at "
                                f"{dest} ({'; '.join(issues)}); run: specmm zoo build {name} --scale {scale}"
                                f"{seed_flag}")
    return dest


def is_built(name: str, scale: str = "cpu", *, seed: int = 0) -> bool:
    """Whether `path(name, scale, seed=seed)` would return a finished, intact build."""
    try:
        path(name, scale, seed=seed)
        return True
    except FileNotFoundError:
        return False


def record(name: str, scale: str = "cpu", *, seed: int = 0) -> dict:
    """The zoo.json of a finished build."""
    return read_manifest(path(name, scale, seed=seed))


__all__ = ["REGISTRY", "ZooEntry", "build", "check", "get", "home", "is_built", "path", "record", "register"]
