"""Text speculative decoding with a small draft model: greedy output equals the target's own `generate`.

    python examples/text_sd.py --target path/to/target --draft path/to/small-draft
    python examples/text_sd.py --tiny          # tiny random Llamas, seconds on a CPU
"""

from __future__ import annotations

import argparse

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

import specmm
from specmm.bench.report import TINY_WARNING
from specmm.drafters import ModelDrafter


def tiny_llama(seed: int, layers: int) -> LlamaForCausalLM:
    """A random-weight Llama (vocabulary 96) built from a config: stands in for real checkpoints in tests."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, bos_token_id=None, eos_token_id=None,
                         pad_token_id=0)
    return LlamaForCausalLM(config).double().eval()


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target")
    parser.add_argument("--draft")
    parser.add_argument("--tiny", action="store_true", help="tiny random models instead of --target/--draft")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    args = parser.parse_args(argv)
    if args.tiny:
        print(TINY_WARNING)  # the same banner as every tiny-scale report
    if args.tiny:
        target, draft = tiny_llama(0, 2), tiny_llama(1, 1)
    else:
        target = AutoModelForCausalLM.from_pretrained(args.target).eval()
        draft = AutoModelForCausalLM.from_pretrained(args.draft).eval()
    prompt = torch.tensor([[5, 17, 42, 8, 23, 61]])  # token ids; use your tokenizer for text
    gen = specmm.SpeculativeGenerator(target, ModelDrafter(draft), tree=specmm.TreeSpec.chain(4))
    out = gen.generate(prompt, max_new_tokens=args.max_new_tokens, sampling=specmm.SamplingConfig(temperature=0.0),
                       pad_token_id=0)
    reference = target.generate(prompt, do_sample=False, max_new_tokens=args.max_new_tokens, pad_token_id=0)
    same = torch.equal(out.sequences, reference)
    print(f"mean accepted {out.stats.mean_accepted:.2f} tokens per target forward; equals generate: {same}")
    return {"sequences": out.sequences, "reference": reference, "stats": out.stats}


if __name__ == "__main__":
    main()
