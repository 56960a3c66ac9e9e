"""Caption a folder of images with a VLM and a ViSpec drafter (train one with `specmm train-drafter`) into a
resumable JSON-lines file, one line per image.

    python examples/caption_folder.py --target path/to/llava --drafter path/to/vispec --images imgs/ --out caps.jsonl
    python examples/caption_folder.py --tiny --images /tmp/imgs --out /tmp/caps.jsonl   # writes 4 test scenes first
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from transformers import AutoModelForImageTextToText, AutoProcessor

import specmm
from specmm.bench.report import TINY_WARNING
from specmm.vlm import SpeculativeVLM, VisionDrafter, caption_images, find_images


def tiny_captioner(images: Path):
    """A random tiny LLaVA with its processor (from the zoo's recipe) and 4 rendered scenes saved into `images`."""
    from specmm.zoo import captioner, scenes

    recipe = captioner.RECIPES["tiny"]
    tokenizer = captioner.train_tokenizer(vocab_size=300, captions=10)
    processor = captioner.make_processor(tokenizer, recipe)
    target = captioner.make_target(recipe, tokenizer, seed=0).double().eval()
    with torch.no_grad():  # a sharper random head: captions that vary from image to image
        target.get_output_embeddings().weight.normal_(0, 0.5, generator=torch.Generator().manual_seed(0))
    images.mkdir(parents=True, exist_ok=True)
    for seed in range(4):
        scenes.render(captioner.scene_and_caption(seed)[0], 48, seed=seed).save(images / f"scene{seed}.png")
    return target, processor


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target")
    parser.add_argument("--drafter", help="ViSpec drafter folder (default: a fresh, untrained ViSpec head)")
    parser.add_argument("--images", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args(argv)
    if args.tiny:
        print(TINY_WARNING)  # the same banner as every tiny-scale report
    if args.tiny:
        target, processor = tiny_captioner(Path(args.images))
    else:
        target = AutoModelForImageTextToText.from_pretrained(args.target, attn_implementation="sdpa").eval()
        processor = AutoProcessor.from_pretrained(args.target)
    torch.manual_seed(0)
    drafter = (VisionDrafter.from_pretrained(args.drafter, target) if args.drafter
               else VisionDrafter.for_target(target, method="vispec"))
    svlm = SpeculativeVLM(target, processor, drafter, tree=specmm.TreeSpec.dynamic(depth=3, top_k=2, total_tokens=8))
    stats = caption_images(svlm, find_images(args.images), args.out, batch_size=2,
                           max_new_tokens=args.max_new_tokens, resume=args.resume)
    print(f"captioned {stats.caption.captioned} images, mean accepted {stats.mean_accepted:.2f} -> {args.out}")
    return {"target": target, "processor": processor, "stats": stats}


if __name__ == "__main__":
    main()
