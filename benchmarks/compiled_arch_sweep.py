"""Compiled mode over many stock HF causal-LM architectures: tokens against HF `generate`, optionally under CUDA
graphs' rules (`tests/graph_pool.py`).

For each `model_type`, a tiny random model built from its config (float64; float32 where HF's own forward needs it:
grouped-GEMM MoE experts, and Gemma2, whose eager attention turns a float64 left-padded batch into NaNs), a noisy
copy as the drafter, a ragged left-padded batch of 3 with an EOS that stops one row early. Each of a chain and a
dynamic tree runs eager and compiled (`aot_eager` backend: the same graphs as inductor, no kernel codegen); a row is
OK when the tokens equal HF `generate(do_sample=False)`'s. With `--rules` the compiled rows run under the rules, and
the report adds what they caught (a graph not recorded, recorded again, or making CPU tensors).

usage: PYTHONPATH=. python benchmarks/compiled_arch_sweep.py [--rules] [--out report.md] [model_type ...]
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.sweep_rules import caught, run_sweep, warned  # noqa: E402
import specmm  # noqa: E402
from specmm.drafters import ModelDrafter  # noqa: E402
from tests.conftest import left_padded_batch, perturbed_copy  # noqa: E402

VOCAB = 96
COMMON = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
              vocab_size=VOCAB, max_position_embeddings=256, pad_token_id=0)
MOE = dict(num_experts_per_tok=2, moe_intermediate_size=32)
WINDOW = dict(sliding_window=12)  # shorter than a run: the window's mask is exercised
CONFIGS: dict[str, dict] = {
    "llama": {}, "qwen2": {}, "qwen3": dict(head_dim=8), "mistral": WINDOW, "ministral": dict(
        **WINDOW, head_dim=8, layer_types=["sliding_attention", "full_attention"]),
    "gemma": dict(head_dim=8), "gemma2": dict(head_dim=8, **WINDOW), "gemma3_text": dict(head_dim=8, **WINDOW),
    "phi": {}, "phi3": {}, "gpt2": dict(n_embd=32, n_layer=2, n_head=4, n_positions=256), "opt": dict(
        ffn_dim=64, word_embed_proj_dim=32), "gpt_neox": {}, "falcon": dict(new_decoder_architecture=True,
                                                                              num_kv_heads=2),
    "cohere": {}, "cohere2": WINDOW, "olmo": {}, "olmo2": {}, "olmo3": WINDOW, "stablelm": {}, "granite": {},
    "starcoder2": {}, "glm": dict(head_dim=8), "helium": dict(head_dim=8), "smollm3": {}, "exaone4": {},
    "ernie4_5": {}, "seed_oss": dict(head_dim=8), "arcee": {}, "hunyuan_v1_dense": dict(head_dim=8), "bitnet": {},
    "apertus": {},
    "mixtral": dict(num_local_experts=4), "qwen2_moe": dict(num_experts=4, shared_expert_intermediate_size=32, **MOE),
    "qwen3_moe": dict(head_dim=8, num_experts=4, **MOE),
    "gpt_oss": dict(head_dim=8, num_local_experts=4, num_experts_per_tok=2, **WINDOW),
    "deepseek_v3": dict(kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
                        head_dim=8, num_key_value_heads=4, n_routed_experts=4, first_k_dense_replace=1, n_group=1,
                        topk_group=1, **MOE),
    # stop 51: chunked attention (Llama 4), older and MoE families
    "llama4_text": dict(head_dim=8, attention_chunk_size=6, no_rope_layers=[1, 0], intermediate_size_mlp=64,
                        num_local_experts=2, interleave_moe_layer_step=2),
    "glm4": dict(head_dim=8), "glm4_moe": dict(head_dim=8, n_routed_experts=4, first_k_dense_replace=1, n_group=1,
                                               topk_group=1, **MOE),
    "phimoe": dict(num_local_experts=4, num_experts_per_tok=2), "olmoe": dict(num_experts=4, num_experts_per_tok=2),
    "nemotron": dict(head_dim=8), "ernie4_5_moe": dict(moe_num_experts=4, moe_k=2, moe_intermediate_size=32,
                                                       moe_layer_start_index=1),
    "gptj": dict(n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=256),
    "gpt_bigcode": dict(n_embd=32, n_layer=2, n_head=4, n_positions=256),
    "gpt_neo": dict(num_layers=2, num_heads=4, attention_types=[[["global", "global"], 1]]),  # local: refused
    "persimmon": {}, "dots1": dict(head_dim=8, n_routed_experts=4, n_shared_experts=1, first_k_dense_replace=1,
                                   n_group=1, topk_group=1, **MOE),
}
FLOAT32 = ("gemma2", "mixtral", "qwen2_moe", "qwen3_moe", "gpt_oss", "deepseek_v3", "llama4_text", "glm4_moe",
           "phimoe", "olmoe", "ernie4_5_moe", "dots1")
TREES = {"chain": specmm.TreeSpec.chain(3), "dynamic": specmm.TreeSpec.dynamic(depth=3, top_k=2, total_tokens=8)}


def tiny(model_type: str) -> torch.nn.Module:
    """A random 2-layer model of `model_type` (sdpa attention where the class has it, else eager)."""
    config = AutoConfig.for_model(model_type, **{**COMMON, **CONFIGS[model_type]})
    for attention in ("sdpa", "eager"):
        torch.manual_seed(0)
        try:
            model = AutoModelForCausalLM.from_config(config, attn_implementation=attention)
            break
        except ValueError:  # "does not support ... scaled_dot_product_attention"
            continue
    model = model.to(torch.float32 if model_type in FLOAT32 else torch.float64).eval()
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = None, 0
    return model


def sweep(model_type: str, pool) -> list[str]:
    """Report lines for one architecture (a line per tree)."""
    target = tiny(model_type)
    draft = perturbed_copy(target, 0.3)
    ids, mask = left_padded_batch([3, 8, 5], vocab=VOCAB, seed=4)
    free = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=16, pad_token_id=0)
    eos = int(free[1, ids.shape[1] + 6])  # row 1 stops early
    reference = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=16, pad_token_id=0,
                                eos_token_id=eos)
    kwargs = dict(attention_mask=mask, max_new_tokens=16, eos_token_id=eos, pad_token_id=0)
    lines = []
    for name, tree in TREES.items():
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            eager = specmm.SpeculativeGenerator(target, ModelDrafter(draft), tree=tree).generate(ids, **kwargs)
            gen = specmm.SpeculativeGenerator(target, ModelDrafter(draft), tree=tree, compile=True)
            out = gen.generate(ids, **kwargs)
        verdict = lambda seqs: "OK" if torch.equal(seqs[:, :reference.shape[1]], reference) else "DIFFERS"  # noqa
        lines.append(f"| {model_type} | {type(target).__name__} | {str(target.dtype)[6:]} | {name} | "
                     f"{verdict(eager.sequences)} | {verdict(out.sequences)} | {gen.whole_round} | "
                     f"{warned(seen)}{caught(pool)} |")
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_types", nargs="*", default=list(CONFIGS))
    parser.add_argument("--rules", action="store_true", help="compiled rows under CUDA graphs' rules")
    parser.add_argument("--out", type=Path, help="write the Markdown table here too")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.model_types) - set(CONFIGS))
    if unknown:
        parser.error(f"no tiny config for {unknown}; known: {sorted(CONFIGS)}")
    columns = ["model_type", "class", "dtype", "tree", "eager = generate", "compiled = generate", "one-graph round",
               "warnings"]
    return run_sweep(args.model_types, sweep, columns, 4, args.rules, args.out)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
