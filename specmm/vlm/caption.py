"""Batch captioning to a JSON-lines file: one line per image as soon as its batch finishes, resumable.

Each line is `{"image": path, "caption": text, "new_tokens": n, "mean_accepted": x}`, or
`{"image": path, "error": "..."}` for an image that cannot be read or whose prompt does not fit in the model's
context (the job goes on, its batch-mates unaffected). `image` is the resolved absolute path: the item's key, so
`imgs/a.png`, `./imgs/a.png` and `/abs/imgs/a.png` are one image.

The output is a job (`specmm.jobs`): a lock refuses a second concurrent run on it, and a manifest next to it
(`<out>.job.json`) records what changes the captions (prompt, budget, sampling and the caller's `settings`, e.g.
model fingerprints). `resume=True` continues only the same job and skips images that already have a complete
line (captions and errors alike); a torn last line left by a killed job is cut off and its image redone; a
finished resumed job is rewritten in input order. `force=True` starts over. The call returns the batches'
`GenerationStats` summed with `add()`, its `caption` extras counting the images, and `wall_time_s` the whole
call (reading and writing included).
"""

from __future__ import annotations

import glob
import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path

from PIL import Image
from tqdm.auto import tqdm

from specmm.core.context import context_limit, context_problem
from specmm.core.sampling import GREEDY, SamplingConfig
from specmm.core.stats import CaptionExtras, GenerationStats
from specmm.jobs import Job, check_file_output, file_key, pending_batches
from specmm.jobs.shards import Processes, ShardedJournal
from specmm.vlm.pipeline import SpeculativeVLM

logger = logging.getLogger(__name__)

DEFAULT_PROMPT = "Describe the picture in detail."  # the instruction `specmm caption` sends without --prompt


def caption_prompt(processor, instruction: str = DEFAULT_PROMPT) -> str:
    """The prompt text for `instruction` in the format the model was trained on: the processor's chat template
    (one user turn holding the image and the instruction, then the generation prompt) when it has one; the
    instruction itself when it already holds the image token (a whole prompt) or there is no template (the image
    token is then prepended, `with_image_token`). A prompt off the training format can leave a drafter with
    nothing accepted."""
    image_token = getattr(processor, "image_token", None)
    if (image_token and image_token in instruction) or not getattr(processor, "chat_template", None):
        return instruction
    turn = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": instruction}]}]
    return processor.apply_chat_template(turn, add_generation_prompt=True, tokenize=False)
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")


def find_images(spec: str | Path) -> list[Path]:
    """A folder's image files (by suffix), or the files a glob pattern matches, sorted."""
    path = Path(spec)
    if not path.exists() and not glob.has_magic(str(spec)):
        raise ValueError(f"images: {str(spec)!r} does not exist (expected a folder of images or a glob pattern)")
    if path.is_dir():
        found = [p for p in path.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES]
    else:
        found = [Path(p) for p in glob.glob(str(spec), recursive=True) if Path(p).is_file()]
    if not found:
        raise ValueError(f"images: no image files match {str(spec)!r}")
    return sorted(found)


def check_output(out_path: str | Path, resume: bool, force: bool = False, argument: str = "out_path") -> None:
    """Refuse (before any model is loaded) a folder, an unwritable path, or an output holding results (the file
    or a killed multi-process run's parts) without resume or force."""
    check_file_output(out_path, resume, force, argument)


def _load(path: Path) -> Image.Image | str:
    """The image as RGB, or the reason it cannot be read."""
    try:
        with Image.open(path) as image:
            return image.convert("RGB")
    except (OSError, ValueError, Image.DecompressionBombError) as err:
        return f"{type(err).__name__}: {err}"


def job_settings(svlm: SpeculativeVLM, prompt: str, max_new_tokens: int, sampling: SamplingConfig,
                 settings: dict | None) -> dict:
    """What changes the captions. Models are named by the caller's `settings` (the CLI gives content
    fingerprints of the model folders); without them, by class, `name_or_path` and parameter count."""
    model = svlm.model
    described = {"target": f"{type(model).__name__} {model.config.name_or_path or '-'} "
                           f"{sum(p.numel() for p in model.parameters())} params",
                 "drafter": type(svlm.generator.drafter).__name__}
    return {"prompt": prompt, "max_new_tokens": max_new_tokens, "sampling": asdict(sampling),
            "tree": repr(svlm.generator.tree), **described, **(settings or {})}


def caption_images(svlm: SpeculativeVLM, image_paths: Sequence[str | Path], out_path: str | Path,
                   batch_size: int = 8, max_new_tokens: int = 128, resume: bool = False,
                   sampling: SamplingConfig = GREEDY, prompt: str = DEFAULT_PROMPT,
                   progress: bool = True, force: bool = False, settings: dict | None = None,
                   argument: str = "out_path") -> GenerationStats:
    """Caption `image_paths` with `svlm` into the JSON-lines file `out_path` (see the module docstring);
    `argument` is how messages name the output (the CLI passes `--out`)."""
    keys = list(dict.fromkeys(file_key(p) for p in image_paths))  # each image once, in order
    if not keys:
        raise ValueError("image_paths: no images given")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size: expected an integer >= 1, got {batch_size!r}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens: expected an integer >= 1, got {max_new_tokens!r}")
    if not isinstance(prompt, str):
        raise ValueError(f"prompt: expected a string, got {type(prompt).__name__}")
    if not isinstance(sampling, SamplingConfig):
        raise ValueError(f"sampling: expected a SamplingConfig, got {type(sampling).__name__}")
    out_path = Path(out_path)
    check_output(out_path, resume, force, argument)
    started = time.perf_counter()
    job = Job(out_path, "caption", job_settings(svlm, prompt, max_new_tokens, sampling, settings), resume=resume,
              force=force, argument=argument)
    processes = Processes(cpu=svlm.model.device.type == "cpu")
    with ShardedJournal(job, "image", processes, what="caption") as journal:
        skipped = sum(k in journal.done_keys for k in keys)
        summary = GenerationStats(caption=CaptionExtras())
        logger.info("captioning %d images (%d already in %s)", len(keys) - skipped, skipped, out_path)
        batches = pending_batches(keys, batch_size, journal.done_keys.__contains__)
        with tqdm(total=len(keys) - skipped, unit="img", desc="captioning",
                  disable=not (progress and processes.is_main)) as bar:
            for batch in processes.my_share(batches):
                records, stats = _caption_batch(svlm, batch, prompt, max_new_tokens, sampling,
                                                skip=set(journal.done_keys))
                summary.add(stats)
                journal.append(records)
                bar.update(max(journal.written() - bar.n, 0) if processes.size > 1 else len(records))
                bar.set_postfix(mean_accepted=f"{summary.mean_accepted:.2f}")
        journal.finish(keys)  # lines in input order (merged from every process), as one uninterrupted run leaves
        summary = _summed(processes.gather(summary))
        summary.caption.skipped = skipped
    summary.wall_time_s = time.perf_counter() - started
    return summary


def _summed(parts: list[GenerationStats]) -> GenerationStats:
    """Every process's stats as one (images and rows appended by rank)."""
    total = GenerationStats(caption=CaptionExtras())
    for part in parts:
        total.add(part)
    return total


def _too_long(svlm: SpeculativeVLM, image: Image.Image, prompt: str, max_new_tokens: int) -> str | None:
    """Why this image's prompt cannot fit in the target's context (None when it fits or the limit is unknown)."""
    limit = context_limit(svlm.model)
    if limit is None:
        return None
    length = svlm.prepare([image], prompt)["input_ids"].shape[1]
    return context_problem(length, max_new_tokens, limit, svlm.generator.tree.depth + 1)


def _caption_batch(svlm: SpeculativeVLM, batch: list[str], prompt: str, max_new_tokens: int,
                   sampling: SamplingConfig, skip: set[str] = frozenset()) -> tuple[list[dict], GenerationStats]:
    """Records for one batch, in input order: captions for readable images that fit the context, errors for the
    others, none for the images in `skip` (done before a resume: they are captioned again with their batch so
    the others get exactly the captions of an uninterrupted run); and the stats of the new records."""
    loaded = {path: _load(Path(path)) for path in batch}
    for path, image in list(loaded.items()):
        if isinstance(image, Image.Image):
            loaded[path] = _too_long(svlm, image, prompt, max_new_tokens) or image
    readable = [p for p in batch if isinstance(loaded[p], Image.Image)]
    records = {p: {"image": p, "error": loaded[p]} for p in batch if p not in readable}
    stats = GenerationStats()
    for path, message in records.items():
        if path not in skip:
            logger.warning("%s: %s", path, message["error"])
    if readable:
        result = svlm.generate([loaded[p] for p in readable], prompt, max_new_tokens=max_new_tokens,
                               sampling=sampling)
        stats = result.stats
        for i, path in enumerate(readable):
            records[path] = {"image": path, "caption": result.texts[i], "new_tokens": stats.new_tokens_per_row[i],
                             "mean_accepted": round(stats.mean_accepted_per_row[i], 4)}
        if skip & set(readable):
            stats = rows_of(stats, [i for i, p in enumerate(readable) if p not in skip])
    new = [p for p in batch if p not in skip]
    stats.caption = CaptionExtras(captioned=len([p for p in new if p in readable]),
                                  errors=len([p for p in new if p not in readable]))
    return [records[p] for p in new], stats


def rows_of(stats: GenerationStats, rows: list[int]) -> GenerationStats:
    """The per-row figures of `rows` only (a re-run batch counts just its new images); batch-wide counters
    (forwards, wall time) stay those of the whole batch."""
    return replace(stats, new_tokens_per_row=[stats.new_tokens_per_row[i] for i in rows],
                   target_forwards_per_row=[stats.target_forwards_per_row[i] for i in rows],
                   new_tokens=sum(stats.new_tokens_per_row[i] for i in rows))
