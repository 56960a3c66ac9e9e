"""Batch captioning to a JSON-lines file: one line per image as soon as its batch finishes, resumable.

Each line is `{"image": path, "caption": text, "new_tokens": n, "mean_accepted": x}`, or
`{"image": path, "error": "..."}` for an image that cannot be read (the job goes on). With `resume=True`
images that already have a complete line (captions and errors alike) are skipped; a torn last line left by
a killed job is cut off and its image redone. The call returns the batches' `GenerationStats` summed with
`add()`, its `caption` extras counting the images, and `wall_time_s` the whole call (reading and writing
included).
"""

from __future__ import annotations

import glob
import json
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path

from PIL import Image
from tqdm.auto import tqdm

from specmm.core.sampling import GREEDY, SamplingConfig
from specmm.core.stats import CaptionExtras, GenerationStats
from specmm.vlm.pipeline import SpeculativeVLM

logger = logging.getLogger(__name__)

DEFAULT_PROMPT = "Describe the picture in detail."
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")


def find_images(spec: str | Path) -> list[Path]:
    """A folder's image files (by suffix), or the files a glob pattern matches, sorted."""
    path = Path(spec)
    if path.is_dir():
        found = [p for p in path.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES]
    else:
        found = [Path(p) for p in glob.glob(str(spec), recursive=True) if Path(p).is_file()]
    if not found:
        raise ValueError(f"images: no image files match {str(spec)!r}")
    return sorted(found)


def check_output(out_path: str | Path, resume: bool) -> None:
    """Refuse to overwrite a non-empty output file unless resuming it."""
    out_path = Path(out_path)
    if out_path.is_dir():
        raise ValueError(f"out_path: {out_path} is a folder, expected a .jsonl file")
    if not resume and out_path.is_file() and out_path.stat().st_size > 0:
        raise ValueError(f"out_path: {out_path} exists and is not empty; resume it (resume=True, --resume) or "
                         "choose another file")


def completed_images(out_path: Path) -> set[str]:
    """Images with a complete line in `out_path`; a torn last line (no newline: a killed job) is cut off."""
    if not out_path.is_file():
        return set()
    data = out_path.read_bytes()
    end = data.rfind(b"\n") + 1  # complete lines end with a newline
    done = set()
    for number, line in enumerate(data[:end].splitlines(), 1):
        if not line.strip():
            continue
        try:
            done.add(json.loads(line)["image"])
        except (ValueError, KeyError, TypeError):
            raise ValueError(f"out_path: line {number} of {out_path} is not a caption record; fix or remove it "
                             "before resuming") from None
    if end < len(data):
        logger.warning("%s: dropping a torn last line (%d bytes); its image is captioned again", out_path,
                       len(data) - end)
        with open(out_path, "r+b") as f:
            f.truncate(end)
    return done


def _load(path: Path) -> Image.Image | str:
    """The image as RGB, or the reason it cannot be read."""
    try:
        with Image.open(path) as image:
            return image.convert("RGB")
    except (OSError, ValueError, Image.DecompressionBombError) as err:
        return f"{type(err).__name__}: {err}"


def caption_images(svlm: SpeculativeVLM, image_paths: Sequence[str | Path], out_path: str | Path,
                   batch_size: int = 8, max_new_tokens: int = 128, resume: bool = False,
                   sampling: SamplingConfig = GREEDY, prompt: str = DEFAULT_PROMPT,
                   progress: bool = True) -> GenerationStats:
    """Caption `image_paths` with `svlm` into the JSON-lines file `out_path` (see the module docstring)."""
    paths = [str(p) for p in image_paths]
    if not paths:
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
    check_output(out_path, resume)
    done = completed_images(out_path) if resume else set()
    todo = list(dict.fromkeys(p for p in paths if p not in done))  # each image once, in order
    summary = GenerationStats(caption=CaptionExtras(skipped=len(set(paths) & done)))
    logger.info("captioning %d images (%d already in %s)", len(todo), summary.caption.skipped, out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with open(out_path, "a", encoding="utf-8") as out, \
            tqdm(total=len(todo), unit="img", desc="captioning", disable=not progress) as bar:
        for start in range(0, len(todo), batch_size):
            batch = todo[start: start + batch_size]
            records, stats = _caption_batch(svlm, batch, prompt, max_new_tokens, sampling)
            summary.add(stats)
            out.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
            out.flush()
            os.fsync(out.fileno())
            bar.update(len(batch))
            bar.set_postfix(mean_accepted=f"{summary.mean_accepted:.2f}")
    summary.wall_time_s = time.perf_counter() - started
    return summary


def _caption_batch(svlm: SpeculativeVLM, batch: list[str], prompt: str, max_new_tokens: int,
                   sampling: SamplingConfig) -> tuple[list[dict], GenerationStats]:
    """Records for one batch, in input order: captions for readable images, errors for the others; and the
    batch's stats with its `caption` extras."""
    loaded = {path: _load(Path(path)) for path in batch}
    readable = [p for p in batch if isinstance(loaded[p], Image.Image)]
    records = {p: {"image": p, "error": loaded[p]} for p in batch if p not in readable}
    stats = GenerationStats()
    for path, message in records.items():
        logger.warning("%s: %s", path, message["error"])
    if readable:
        result = svlm.generate([loaded[p] for p in readable], prompt, max_new_tokens=max_new_tokens,
                               sampling=sampling)
        stats = result.stats
        for i, path in enumerate(readable):
            records[path] = {"image": path, "caption": result.texts[i], "new_tokens": stats.new_tokens_per_row[i],
                             "mean_accepted": round(stats.mean_accepted_per_row[i], 4)}
    stats.caption = CaptionExtras(captioned=len(readable), errors=len(batch) - len(readable))
    return [records[p] for p in batch], stats
