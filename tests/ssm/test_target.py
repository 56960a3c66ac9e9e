"""The SSM target adapter against the unmodified HF models (target.py).

HF's torch path computes the SSM scan in float32 even for float64 models (it calls `.float()` on x, B, C and
A), so logits and SSM states are compared to HF within float32 rounding (1e-5); conv states are raw inputs
and match to 1e-12 in the first mixer layer. The float64 exactness of the tree math itself is pinned in
test_tree_scan.py (1e-10).
For Falcon-H1 and GraniteMoeHybrid the whole model is also checked in float64: HF's forward of each path with only
its mixers' scan swapped for the float64 recurrence (attention, MoE and every multiplier stay HF's), to 1e-8.
"""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch

import specmm
from specmm.core.tree import DraftTree
from specmm.ssm import SSMTarget
from specmm.ssm.tree_scan import is_mamba2_mixer
from tests.ssm.conftest import (
    ARCHS,
    CHUNK,
    KERNEL,
    NEW_HYBRIDS,
    VOCAB,
    depths_of,
    random_parents,
    tiny_ssm,
)
from tests.ssm.test_tree_scan import recurrent_reference

PROMPT = torch.tensor([[5, 17, 3, 44, 9, 21, 8, 30, 2, 61, 12]])


def one_tree(parents: list[int], gen: torch.Generator) -> DraftTree:
    n = len(parents)
    depth = depths_of(parents)
    return DraftTree(tokens=torch.randint(1, VOCAB, (1, n), generator=gen), parents=torch.tensor([parents]),
                     depth=torch.tensor([depth]), valid=torch.ones(1, n, dtype=torch.bool), max_depth=max(depth),
                     max_children=n)


def path_to(parents: list[int], node: int) -> list[int]:
    path = [node]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    return path[::-1]


def hf_states(model, ids: torch.Tensor, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """conv [C, K] and SSM [H, P, N] states of an HF cached forward over ids [1, L]."""
    out = model(ids, use_cache=True)
    cache = out.cache_params if hasattr(out, "cache_params") and out.cache_params is not None else out.past_key_values
    if hasattr(cache, "get_conv_state"):
        return cache.get_conv_state(layer)[0], cache.get_recurrent_state(layer)[0]
    states = cache.layers[layer]  # transformers before 5.24: the layer's states by index
    return states.conv_states[0][0], states.recurrent_states[0][0]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kind", ["chain", "star", "random"])
def test_tree_logits_and_commits_match_hf_runs_of_each_path(arch, kind):
    model = tiny_ssm(arch, time_step_min=0.05 if arch == "nemotron_h" else None)
    gen = torch.Generator().manual_seed(11)
    parents = random_parents(13, gen, kind)
    tree = one_tree(parents, gen)
    target = specmm.core.as_target(model)
    assert isinstance(target, SSMTarget)
    target.start(1)
    with torch.no_grad():
        target.prefill(PROMPT, torch.ones_like(PROMPT))
        logits = target.verify(tree).logits  # [1, n, V]
        for node in range(len(parents)):
            ids = torch.cat([PROMPT, tree.tokens[:, path_to(parents, node)]], 1)
            torch.testing.assert_close(logits[0, node], model(ids).logits[0, -1].to(logits.dtype), rtol=0, atol=1e-5)
        node = len(parents) - 1 if kind != "star" else 5
        path = torch.tensor([path_to(parents, node)])
        target.commit(path, torch.tensor([path.shape[1]]))
        ids = torch.cat([PROMPT, tree.tokens[:, path[0]]], 1)
        first = min(target.mixers)
        for layer in target.mixers:
            conv, ssm = hf_states(model, ids, layer)
            # the first mixer's conv inputs are exact; later ones carry HF's float32 scan error from below
            atol = 1e-12 if layer == first else 1e-5
            torch.testing.assert_close(target.states.conv[layer][0], conv, rtol=0, atol=atol)
            torch.testing.assert_close(target.states.ssm[layer][0], ssm.to(torch.float64), rtol=0, atol=1e-5)
    if kind == "chain":
        assert max(depths_of(parents)) > CHUNK > KERNEL


@contextmanager
def float64_scans(model):
    """For the `with` block, each Mamba2 mixer of `model` (batch 1, no cache) runs the float64 recurrence from zero
    states instead of HF's float32 torch scan; yields {layer: (conv, ssm)}, the final states of the last forward."""
    multipliers = getattr(model.config, "ssm_multipliers", None)  # Falcon-H1's mup multipliers
    finals: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def recurrent(mixer):
        def forward(hidden_states, *args, **kwargs):
            conv = hidden_states.new_zeros(mixer.conv_dim, KERNEL)
            ssm = hidden_states.new_zeros(mixer.num_heads, mixer.head_dim, mixer.ssm_state_size)
            out, *finals[mixer.layer_idx] = recurrent_reference(mixer, hidden_states[0], conv, ssm, multipliers)
            return out[None]
        return forward

    mixers = [m for m in model.modules() if is_mamba2_mixer(m)]
    try:
        for mixer in mixers:
            mixer.forward = recurrent(mixer)
        yield finals
    finally:
        for mixer in mixers:
            mixer.__dict__.pop("forward", None)


@pytest.mark.parametrize("arch", NEW_HYBRIDS)
def test_tree_logits_and_commits_equal_float64_path_forwards(arch):
    model = tiny_ssm(arch)
    gen = torch.Generator().manual_seed(5)
    parents = random_parents(13, gen, "random")
    tree = one_tree(parents, gen)
    target = SSMTarget(model)
    target.start(1)
    with torch.no_grad():
        target.prefill(PROMPT, torch.ones_like(PROMPT))
        logits = target.verify(tree).logits  # [1, n, V]
        with float64_scans(model) as finals:
            for node in range(len(parents)):  # the last one leaves its path's states in `finals`
                ids = torch.cat([PROMPT, tree.tokens[:, path_to(parents, node)]], 1)
                torch.testing.assert_close(logits[0, node], model(ids).logits[0, -1], rtol=0, atol=1e-8)
        path = torch.tensor([path_to(parents, len(parents) - 1)])
        target.commit(path, torch.tensor([path.shape[1]]))
    assert sorted(finals) == sorted(target.mixers) and path.shape[1] > 2
    for layer, (conv, ssm) in finals.items():
        torch.testing.assert_close(target.states.conv[layer][0], conv, rtol=0, atol=1e-12)
        torch.testing.assert_close(target.states.ssm[layer][0], ssm, rtol=0, atol=1e-10)


def test_hybrid_commit_keeps_the_accepted_attention_rows():
    """After a commit, the next verify sees exactly prefix + path in the attention cache (Bamba, RoPE)."""
    model = tiny_ssm("bamba")
    gen = torch.Generator().manual_seed(2)
    parents = random_parents(9, gen, "random")
    tree = one_tree(parents, gen)
    target = SSMTarget(model)
    target.start(1)
    with torch.no_grad():
        target.prefill(PROMPT, torch.ones_like(PROMPT))
        target.verify(tree)
        path = torch.tensor([path_to(parents, 8)])
        target.commit(path, torch.tensor([path.shape[1]]))
        assert target.kv.physical_length == PROMPT.shape[1] + path.shape[1]
        follow = one_tree([-1, 0, 1], gen)
        logits = target.verify(follow).logits
        ids = torch.cat([PROMPT, tree.tokens[:, path[0]], follow.tokens], 1)
        torch.testing.assert_close(logits[0], model(ids).logits[0, -3:], rtol=0, atol=1e-5)


def test_unsupported_models_and_arguments_raise_value_errors():
    from tests.conftest import tiny_model

    with pytest.raises(ValueError, match="target: LlamaForCausalLM is not supported"):
        SSMTarget(tiny_model("llama"))
    model = tiny_ssm("mamba2")
    with pytest.raises(ValueError, match="commit_mode"):
        SSMTarget(model, commit_mode="select")
    with pytest.raises(ValueError, match="prefill_block"):
        SSMTarget(model, prefill_block=0)
    target = SSMTarget(model)
    with pytest.raises(ValueError, match="drafter: needs"):
        target.start(1, needs=frozenset({"features"}))
    with pytest.raises(ValueError, match="pixel_values"):
        target.check_model_inputs({"pixel_values": None})
    eagle = specmm.drafters.EagleDrafter.for_target(tiny_model("llama", vocab=VOCAB))
    with pytest.raises(ValueError, match="does not provide"):
        specmm.SpeculativeGenerator(model, eagle).generate(PROMPT, max_new_tokens=2)
    from transformers import MambaConfig, MambaForCausalLM

    mamba1 = MambaForCausalLM(MambaConfig(vocab_size=VOCAB, hidden_size=8, state_size=4, num_hidden_layers=1))
    with pytest.raises(ValueError, match="MambaForCausalLM is not supported by the SSM adapter"):
        specmm.SpeculativeGenerator(mamba1, eagle)
