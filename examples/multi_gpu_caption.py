"""A caption job over every GPU of a node (or several nodes) with `accelerate launch`: each process captions its
fixed share of the images into a part file, and the main process merges the parts into the one JSON-lines file a
single-process run writes. Rerun with --resume after a crash, with any number of processes.

    accelerate launch --num_processes 8 examples/multi_gpu_caption.py --target llava/ --drafter vispec/ \
        --images imgs/ --out caps.jsonl
    python examples/multi_gpu_caption.py --tiny --images /tmp/imgs --out /tmp/caps.jsonl   # one process
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from accelerate import PartialState
from transformers import AutoModelForImageTextToText, AutoProcessor

import specmm
from specmm.bench.report import TINY_WARNING
from specmm.vlm import SpeculativeVLM, VisionDrafter, caption_images, find_images


def tiny_captioner(images: Path):
    """The same random tiny LLaVA on every process (seeded), and 4 scenes written by the main process."""
    from specmm.zoo import captioner, scenes

    recipe = captioner.RECIPES["tiny"]
    tokenizer = captioner.train_tokenizer(vocab_size=300, captions=10)
    processor = captioner.make_processor(tokenizer, recipe)
    target = captioner.make_target(recipe, tokenizer, seed=0).double().eval()
    with torch.no_grad():  # a sharper random head: captions that vary from image to image
        target.get_output_embeddings().weight.normal_(0, 0.5, generator=torch.Generator().manual_seed(0))
    with PartialState().main_process_first():
        images.mkdir(parents=True, exist_ok=True)
        for seed in range(4):
            path = images / f"scene{seed}.png"
            if not path.exists():
                scenes.render(captioner.scene_and_caption(seed)[0], 48, seed=seed).save(path)
    return target, processor


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target")
    parser.add_argument("--drafter", help="VisionDrafter folder (default: prompt lookup, no draft model)")
    parser.add_argument("--images", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args(argv)
    if args.tiny:
        print(TINY_WARNING)  # the same banner as every tiny-scale report
    state = PartialState(cpu=not torch.cuda.is_available())  # its device: this process's GPU
    if args.tiny:
        target, processor = tiny_captioner(Path(args.images))
    else:
        target = AutoModelForImageTextToText.from_pretrained(args.target, dtype=torch.bfloat16,
                                                             attn_implementation="sdpa").to(state.device).eval()
        processor = AutoProcessor.from_pretrained(args.target)
    if args.drafter:
        drafter, tree = VisionDrafter.from_pretrained(args.drafter, target), specmm.TreeSpec.dynamic(5, 4, 24)
    else:
        drafter, tree = specmm.drafters.PromptLookupDrafter(ngram=3, k=8), specmm.TreeSpec.chain(8)
    svlm = SpeculativeVLM(target, processor, drafter, tree=tree)
    stats = caption_images(svlm, find_images(args.images), args.out, batch_size=args.batch_size,
                           max_new_tokens=args.max_new_tokens, resume=args.resume)
    if state.is_main_process:
        print(f"{state.num_processes} process(es): captioned {stats.caption.captioned}, errors "
              f"{stats.caption.errors} -> {args.out}")
    return {"target": target, "processor": processor, "stats": stats}


if __name__ == "__main__":
    main()
