"""EAGLE-2 dynamic-tree decoding on a stock HF model: load a trained head (`--eagle`, upstream checkpoint layout)
or distil one here with `specmm.core.eagle_train.train_eagle`; an untrained head is still exact, only slower.

    python examples/eagle.py --target path/to/model --eagle path/to/eagle-head
    python examples/eagle.py --tiny
"""

from __future__ import annotations

import argparse

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

import specmm
from specmm.bench.report import TINY_WARNING
from specmm.drafters import EagleDrafter


def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, bos_token_id=None, eos_token_id=None,
                         pad_token_id=0)
    return LlamaForCausalLM(config).double().eval()


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target")
    parser.add_argument("--eagle", help="EAGLE head folder (default: an untrained head)")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    args = parser.parse_args(argv)
    if args.tiny:
        print(TINY_WARNING)  # the same banner as every tiny-scale report
    target = tiny_llama() if args.tiny else AutoModelForCausalLM.from_pretrained(args.target).eval()
    head = EagleDrafter.from_pretrained(args.eagle, target) if args.eagle else EagleDrafter.for_target(target)
    gen = specmm.SpeculativeGenerator(target, head, tree=specmm.TreeSpec.dynamic(depth=4, top_k=4, total_tokens=16))
    prompts = torch.tensor([[0, 0, 7, 19, 33], [4, 11, 52, 3, 90]])  # left-padded with 0
    mask = (prompts != 0).long()
    out = gen.generate(prompts, attention_mask=mask, max_new_tokens=args.max_new_tokens, pad_token_id=0,
                       sampling=specmm.SamplingConfig(temperature=0.0))
    reference = target.generate(prompts, attention_mask=mask, do_sample=False, max_new_tokens=args.max_new_tokens,
                                pad_token_id=0)
    print(f"EAGLE-2: mean accepted {out.stats.mean_accepted:.2f}; equals generate: "
          f"{torch.equal(out.sequences, reference)}")
    return {"sequences": out.sequences, "reference": reference, "stats": out.stats}


if __name__ == "__main__":
    main()
