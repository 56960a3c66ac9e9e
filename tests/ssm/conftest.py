"""Tiny random-weight Mamba2 / Bamba / NemotronH / Zamba2 / Falcon-H1 / GraniteMoeHybrid models (float64) and random
trees for the SSM tests. The Falcon-H1 and GraniteMoeHybrid configs set every multiplier away from 1."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    BambaConfig,
    BambaForCausalLM,
    FalconH1Config,
    FalconH1ForCausalLM,
    GraniteMoeHybridConfig,
    GraniteMoeHybridForCausalLM,
    Mamba2Config,
    Mamba2ForCausalLM,
    NemotronHConfig,
    NemotronHForCausalLM,
    Zamba2Config,
    Zamba2ForCausalLM,
)

from tests.conftest import one_torch_thread

VOCAB = 64
CHUNK = 8  # scan chunk size: trees and prompts go deeper than this
KERNEL = 4


def _configs(vocab: int) -> dict:
    return {
        "mamba2": (Mamba2ForCausalLM, Mamba2Config(
            vocab_size=vocab, hidden_size=16, expand=2, num_heads=4, head_dim=8, n_groups=2, state_size=8,
            conv_kernel=KERNEL, chunk_size=CHUNK, num_hidden_layers=2, bos_token_id=None, eos_token_id=None,
            pad_token_id=0, tie_word_embeddings=False)),
        "bamba": (BambaForCausalLM, BambaConfig(
            vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=3, attn_layer_indices=[1],
            num_attention_heads=2, num_key_value_heads=1, mamba_n_heads=4, mamba_d_head=8, mamba_n_groups=2,
            mamba_d_state=8, mamba_d_conv=KERNEL, mamba_expand=2, mamba_chunk_size=CHUNK, bos_token_id=None,
            eos_token_id=None, pad_token_id=0, max_position_embeddings=256, tie_word_embeddings=False)),
        "nemotron_h": (NemotronHForCausalLM, NemotronHConfig(
            vocab_size=vocab, hidden_size=16, intermediate_size=32, layers_block_type=[
                "linear_attention", "full_attention", "mlp", "linear_attention"],
            num_attention_heads=2, num_key_value_heads=1, head_dim=8, mamba_num_heads=4, mamba_head_dim=8,
            n_groups=2, ssm_state_size=8, conv_kernel=KERNEL, chunk_size=CHUNK, bos_token_id=None,
            eos_token_id=None, pad_token_id=0, max_position_embeddings=256, tie_word_embeddings=False)),
        "zamba2": (Zamba2ForCausalLM, Zamba2Config(
            vocab_size=vocab, hidden_size=16, num_hidden_layers=3, layers_block_type=[
                "linear_attention", "hybrid", "linear_attention"], mamba_d_state=8, mamba_d_conv=KERNEL,
            mamba_expand=2, mamba_ngroups=2, n_mamba_heads=4, chunk_size=CHUNK, num_attention_heads=2,
            num_key_value_heads=2, intermediate_size=32, use_mem_rope=True,
            bos_token_id=None, eos_token_id=None, pad_token_id=0, max_position_embeddings=256,
            tie_word_embeddings=False)),
        "falcon_h1": (FalconH1ForCausalLM, FalconH1Config(
            vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, mamba_d_ssm=32, mamba_n_heads=4, mamba_d_head=8, mamba_n_groups=2,
            mamba_d_state=8, mamba_d_conv=KERNEL, mamba_chunk_size=CHUNK, mamba_rms_norm=False,
            ssm_multipliers=[0.75, 1.25, 0.875, 1.5, 0.625], ssm_in_multiplier=1.4, ssm_out_multiplier=0.6,
            attention_in_multiplier=0.8, attention_out_multiplier=1.25, key_multiplier=0.5, mlp_multipliers=[1.2, 0.9],
            embedding_multiplier=1.5, lm_head_multiplier=0.75, bos_token_id=None, eos_token_id=None, pad_token_id=0,
            max_position_embeddings=256, tie_word_embeddings=False)),
        "granite_hybrid": (GraniteMoeHybridForCausalLM, GraniteMoeHybridConfig(
            vocab_size=vocab, hidden_size=16, intermediate_size=16, shared_intermediate_size=32, num_hidden_layers=3,
            layer_types=["linear_attention", "full_attention", "linear_attention"], num_attention_heads=2,
            num_key_value_heads=1, num_local_experts=4, num_experts_per_tok=2, position_embedding_type="rope",
            mamba_n_heads=4, mamba_d_head=8, mamba_n_groups=2, mamba_d_state=8, mamba_d_conv=KERNEL, mamba_expand=2,
            mamba_chunk_size=CHUNK, embedding_multiplier=1.5, residual_multiplier=0.7, attention_multiplier=0.3,
            logits_scaling=1.5, bos_token_id=None, eos_token_id=None, pad_token_id=0, max_position_embeddings=256,
            tie_word_embeddings=False, experts_implementation="eager")),  # grouped_mm takes no float64
    }


ARCHS = ("mamba2", "bamba", "nemotron_h", "zamba2", "falcon_h1", "granite_hybrid")
NEW_HYBRIDS = ("falcon_h1", "granite_hybrid")
# Compiled mode is tested on the first four, for the suite's time. Falcon-H1 and GraniteMoeHybrid (eager experts,
# graph breaks inside the layer loop) pass the same test too (about 1 minute each on 2 loaded cores).
COMPILED_ARCHS = ARCHS[:4]


@pytest.fixture(autouse=True, scope="module")
def one_cpu_thread():
    """Tiny float64 convolutions are ~1000x slower with contended OpenMP threads; run this package single-threaded."""
    with one_torch_thread():
        yield


def tiny_ssm(arch: str, seed: int = 0, vocab: int = VOCAB, dtype=torch.float64, logit_scale: float = 1.0,
             time_step_min: float | None = None, **overrides):
    """A tiny random `arch` model with randomised dt_bias / A_log / D so every decay rate differs; `overrides` are
    set on its config."""
    model_cls, config = _configs(vocab)[arch]
    if time_step_min is not None:
        config.time_step_min = time_step_min
    for name, value in overrides.items():
        setattr(config, name, value)
    if arch != "mamba2":
        config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    model = model_cls(config).to(dtype).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for module in model.modules():
            if hasattr(module, "A_log") and hasattr(module, "dt_bias"):
                module.A_log.copy_(torch.rand(module.A_log.shape, generator=gen, dtype=torch.float64) * 2 - 1)
                module.dt_bias.copy_(torch.randn(module.dt_bias.shape, generator=gen, dtype=torch.float64) - 1)
                module.D.copy_(torch.randn(module.D.shape, generator=gen, dtype=torch.float64))
        if logit_scale != 1.0:
            model.get_output_embeddings().weight.mul_(logit_scale)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def random_parents(n: int, gen: torch.Generator, kind: str = "random") -> list[int]:
    """Parents of an n-node tree in topological order (node 0 is the root)."""
    if kind == "chain":
        return [-1] + list(range(n - 1))
    if kind == "star":
        return [-1] + [0] * (n - 1)
    return [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)]


def depths_of(parents: list[int]) -> list[int]:
    depth = []
    for p in parents:
        depth.append(0 if p < 0 else depth[p] + 1)
    return depth


def aligned_drafter_model(target, residual_scale: float = 4.0, seed: int = 7):
    """A tiny Llama sharing the target's embeddings and head, both scaled so the residual stream dominates.

    Target and draft then both behave mostly like the same bigram model, so drafts are often but not always
    accepted: acceptance paths of every length get exercised.
    """
    from tests.conftest import tiny_model

    with torch.no_grad():
        target.get_input_embeddings().weight.mul_(residual_scale)
    draft = tiny_model("llama", seed=seed, vocab=target.config.vocab_size, hidden_size=target.config.hidden_size,
                       intermediate_size=32, num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=1)
    with torch.no_grad():
        draft.get_input_embeddings().weight.copy_(target.get_input_embeddings().weight)
        draft.get_output_embeddings().weight.copy_(target.get_output_embeddings().weight)
    return draft
