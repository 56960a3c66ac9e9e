r"""Class-conditional image sampling from a LlamaGen checkpoint with Jacobi drafts and GSD acceptance (lossy, fast)
or exact acceptance; `--acceptance exact --temperature 0` gives plain greedy decoding's tokens.

    python examples/sample_images.py --gpt c2i_B_256.pt --gpt-config GPT-B --vq vq_ds16_c2i.pt \
        --classes 207 360 --out samples/
    python examples/sample_images.py --tiny --out /tmp/samples
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from specmm.image_ar import GSD, ImageSampler, LlamaGen
from specmm.bench.report import TINY_WARNING


def tiny_llamagen() -> LlamaGen:
    torch.manual_seed(0)
    gpt = {"dim": 32, "n_layer": 2, "n_head": 2, "vocab_size": 64, "block_size": 16, "num_classes": 10,
           "model_type": "c2i"}
    vq = {"codebook_size": 64, "codebook_embed_dim": 8, "ch": 32, "ch_mult": [1, 2], "z_channels": 32,
          "num_res_blocks": 1}
    lg = LlamaGen.from_config(gpt, vq).eval()
    with torch.no_grad():
        lg.gpt.output.weight.mul_(8.0)  # sharper random distributions
    return lg


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpt", help="upstream GPT .pt")
    parser.add_argument("--vq", help="upstream VQ .pt")
    parser.add_argument("--gpt-config", default="GPT-B", help="upstream model name of --gpt")
    parser.add_argument("--classes", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--acceptance", choices=["gsd", "exact"], default="gsd")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--out", required=True)
    parser.add_argument("--tiny", action="store_true")
    args = parser.parse_args(argv)
    if args.tiny:
        print(TINY_WARNING)  # the same banner as every tiny-scale report
    lg = tiny_llamagen() if args.tiny else LlamaGen.from_checkpoint(args.gpt, args.vq, args.gpt_config).eval()
    rule = GSD() if args.acceptance == "gsd" else "exact"
    sampler = ImageSampler(lg, proposer="jacobi", acceptance=rule, window=8 if args.tiny else 16)
    classes = torch.tensor(args.classes)
    sample = sampler.sample(classes, temperature=args.temperature, generator=torch.Generator().manual_seed(0))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    for i, image in enumerate(sample.images):
        image.save(Path(args.out) / f"class{args.classes[i]}_{i}.png")
    print(f"{len(sample.images)} images, {sample.stats.mean_accepted:.2f} tokens per target forward -> {args.out}")
    return {"lg": lg, "tokens": sample.tokens, "stats": sample.stats}


if __name__ == "__main__":
    main()
