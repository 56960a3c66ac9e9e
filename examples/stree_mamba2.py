"""STree: a whole draft tree verified in one forward of a stock Mamba2 (or Bamba / NemotronH / Zamba2 / Falcon-H1 /
GraniteMoeHybrid hybrid), the accepted node's states committed in closed form; greedy output equals the model's
own `generate`.

    python examples/stree_mamba2.py --target path/to/mamba2 --draft path/to/small-lm
    python examples/stree_mamba2.py --tiny
"""

from __future__ import annotations

import argparse

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Mamba2Config, Mamba2ForCausalLM

import specmm
from specmm.bench.report import TINY_WARNING
from specmm.drafters import ModelDrafter


def tiny_models() -> tuple[Mamba2ForCausalLM, LlamaForCausalLM]:
    torch.manual_seed(0)
    target = Mamba2ForCausalLM(Mamba2Config(
        vocab_size=64, hidden_size=16, expand=2, num_heads=4, head_dim=8, n_groups=2, state_size=8, conv_kernel=4,
        chunk_size=8, num_hidden_layers=2, bos_token_id=None, eos_token_id=None, pad_token_id=0,
        tie_word_embeddings=False)).double().eval()
    draft = LlamaForCausalLM(LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, bos_token_id=None, eos_token_id=None, pad_token_id=0)).double().eval()
    return target, draft


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target")
    parser.add_argument("--draft")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--max-new-tokens", type=int, default=24)
    args = parser.parse_args(argv)
    if args.tiny:
        print(TINY_WARNING)  # the same banner as every tiny-scale report
    if args.tiny:
        target, draft = tiny_models()
    else:
        target = AutoModelForCausalLM.from_pretrained(args.target).eval()
        draft = AutoModelForCausalLM.from_pretrained(args.draft).eval()
    gen = specmm.SpeculativeGenerator(target, ModelDrafter(draft),
                                      tree=specmm.TreeSpec.dynamic(depth=3, top_k=2, total_tokens=8))
    prompt = torch.tensor([[3, 14, 15, 9, 26, 5, 35, 8, 9, 7, 9, 3]])
    out = gen.generate(prompt, max_new_tokens=args.max_new_tokens, sampling=specmm.SamplingConfig(temperature=0.0),
                       pad_token_id=0)
    reference = target.generate(prompt, do_sample=False, max_new_tokens=args.max_new_tokens, pad_token_id=0)
    print(f"STree: mean accepted {out.stats.mean_accepted:.2f}; equals generate: "
          f"{torch.equal(out.sequences, reference)}")
    return {"sequences": out.sequences, "reference": reference, "stats": out.stats}


if __name__ == "__main__":
    main()
