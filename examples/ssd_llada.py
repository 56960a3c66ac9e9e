"""Self-speculative decoding (SSD) of a LLaDA-layout diffusion LM: the model drafts several unmaskings and verifies
them itself; the output equals step-by-step decoding in fewer forwards.

    python examples/ssd_llada.py --model path/to/llada      # a specmm MaskedDiffusionLM folder
    python examples/ssd_llada.py --tiny
"""

from __future__ import annotations

import argparse

import torch

from specmm.diffusion_lm import LLaDAConfig, MaskedDiffusionLM, generate
from specmm.bench.report import TINY_WARNING


def tiny_llada() -> MaskedDiffusionLM:
    config = LLaDAConfig(d_model=32, n_heads=4, n_kv_heads=2, n_layers=2, mlp_hidden_size=48, vocab_size=40,
                         mask_token_id=39, eos_token_id=0, max_sequence_length=96, rope_theta=10000.0)
    return MaskedDiffusionLM(config).init_weights(std=0.5, seed=0).double().eval()


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--gen-length", type=int, default=32)
    args = parser.parse_args(argv)
    if args.tiny:
        print(TINY_WARNING)  # the same banner as every tiny-scale report
    model = tiny_llada() if args.tiny else MaskedDiffusionLM.from_pretrained(args.model).eval()
    prompt = torch.tensor([[5, 9, 13, 2, 7, 21], [11, 3, 8, 30, 6, 17]])
    blocks = dict(gen_length=args.gen_length, block_length=args.gen_length // 2)
    ssd = generate(model, prompt, method="ssd", draft_size=4, tree_width=2, **blocks)
    stepwise = generate(model, prompt, method="stepwise", **blocks)
    print(f"SSD: {ssd.stats.target_forwards} forwards vs {stepwise.stats.target_forwards} stepwise; same tokens: "
          f"{torch.equal(ssd.sequences, stepwise.sequences)}")
    return {"ssd": ssd, "stepwise": stepwise}


if __name__ == "__main__":
    main()
