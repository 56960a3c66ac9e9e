"""The tree mixer against a float64 step-by-step recurrence over each root->node path (tree_scan.py).

The reference runs the Mamba2 recurrence token by token on the HF mixer's own weights, starting from random
committed conv/SSM states; the tree pass (ancestor-masked quadratic form) must agree to 1e-10 for every
node, and the closed-form commit / the replay commit must give the recurrence's final states. For Falcon-H1 the
reference applies the config's mup multipliers itself (input multiplier, one multiplier per projected segment) and
gates with silu alone when the mixer has no gated RMS norm.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specmm.core.tree import ancestor_mask
from specmm.ssm.tree_scan import (
    TreeLayout,
    commit_state,
    decay,
    replay_state,
    step_sizes,
    tree_mixer_forward,
)
from tests.ssm.conftest import CHUNK, KERNEL, depths_of, random_parents, tiny_ssm

NODES = 14  # deeper than the conv kernel (4) and the scan chunk (8) for chains


def reference_projection(mixer, hidden, ssm_multipliers=None):
    """in_proj of hidden [L, D]; Falcon-H1 (`ssm_multipliers`, its config's z/x/B/C/dt multipliers) scales the input
    by `ssm_in_multiplier` and each projected segment by its multiplier."""
    if ssm_multipliers is None:
        return mixer.in_proj(hidden)
    inner, group_state = mixer.intermediate_size, mixer.n_groups * mixer.ssm_state_size
    segments = mixer.in_proj(hidden * mixer.ssm_in_multiplier).split(
        [inner, inner, group_state, group_state, mixer.num_heads], dim=-1)
    return torch.cat([segment * m for segment, m in zip(segments, ssm_multipliers)], dim=-1)


def recurrent_reference(mixer, hidden, conv_state, ssm_state, ssm_multipliers=None, clamp: bool = False):
    """Sequential Mamba2 over hidden [L, D] from conv_state [C, K], ssm_state [H, P, N] -> (out [L, D], conv, ssm);
    `clamp`: step sizes clamped to time_step_limit (HF's prefill) or not (its one-token decode)."""
    heads, head_dim, groups, state = mixer.num_heads, mixer.head_dim, mixer.n_groups, mixer.ssm_state_size
    inner, channels = mixer.intermediate_size, mixer.conv_dim
    gate, xbc, dt_raw = reference_projection(mixer, hidden, ssm_multipliers).split([inner, channels, heads], dim=-1)
    history = torch.cat([conv_state, xbc.T], dim=1)  # [C, K + L]
    conv = F.conv1d(history[None], mixer.conv1d.weight, mixer.conv1d.bias, groups=channels)[0, :, 1:].T  # [L, C]
    x, b, c = mixer.act(conv).split([inner, groups * state, groups * state], dim=-1)
    dt = step_sizes(mixer, dt_raw, torch.float64, clamp=clamp)  # [L, H]
    A = -torch.exp(mixer.A_log.float()).double()
    outs = []
    for t in range(hidden.shape[0]):
        xt = x[t].view(heads, head_dim)
        bt = b[t].view(groups, state).repeat_interleave(heads // groups, 0)  # [H, N]
        ct = c[t].view(groups, state).repeat_interleave(heads // groups, 0)
        ssm_state = (dt[t] * A).exp()[:, None, None] * ssm_state + dt[t][:, None, None] * xt[:, :, None] * bt[:, None]
        outs.append((ssm_state @ ct[:, :, None])[..., 0] + mixer.D[:, None] * xt)
    y = torch.stack(outs).reshape(-1, inner)
    y = mixer.norm(y, gate) if getattr(mixer, "mamba_rms_norm", True) else y * F.silu(gate)
    return mixer.out_proj(y), history[:, -KERNEL:], ssm_state


def tree_case(kind: str, seed: int):
    gen = torch.Generator().manual_seed(seed)
    parents = random_parents(NODES, gen, kind)
    return torch.tensor([parents]), torch.tensor([depths_of(parents)]), gen


def path_to(parents: list[int], node: int) -> list[int]:
    path = [node]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    return path[::-1]


LIMITED = {"time_step_limit": (0.5, 0.6)}  # binds for most step sizes
MIXERS = {  # case -> (arch, config overrides, nodes are prompt tokens: Δ clamped); Falcon-H1 also with its gated
    # RMS norm (normalised before the gate)
    "mamba2": ("mamba2", {}, False), "nemotron_h": ("nemotron_h", {"time_step_min": 0.05}, False),
    "mamba2_limited": ("mamba2", LIMITED, False), "mamba2_limited_prompt": ("mamba2", LIMITED, True),
    "falcon_h1": ("falcon_h1", {}, False), "falcon_h1_rms_norm": ("falcon_h1", {"mamba_rms_norm": True}, False),
    "granite_hybrid": ("granite_hybrid", {}, False),
}  # Falcon-H1 holds its mup vector in float32: the test config's multipliers are exact in float32


@pytest.mark.parametrize("case", list(MIXERS))
@pytest.mark.parametrize("kind", ["chain", "star", "random"])
def test_tree_outputs_and_commits_equal_the_recurrence_over_each_path(case, kind):
    arch, overrides, prompt = MIXERS[case]
    model = tiny_ssm(arch, **overrides)
    multipliers = model.config.ssm_multipliers if arch.startswith("falcon_h1") else None
    mixer = next(m for m in model.modules() if hasattr(m, "A_log"))
    parents, depth, gen = tree_case(kind, seed=3)
    ancestors = ancestor_mask(parents, depth, int(depth.max()))
    layout = TreeLayout.build(parents, depth, ancestors, torch.ones_like(parents, dtype=torch.bool), KERNEL)
    hidden = torch.randn(1, NODES, model.config.hidden_size, generator=gen, dtype=torch.float64)
    conv_state = torch.randn(1, mixer.conv_dim, KERNEL, generator=gen, dtype=torch.float64)
    ssm_state = torch.randn(1, mixer.num_heads, mixer.head_dim, mixer.ssm_state_size, generator=gen,
                            dtype=torch.float64)
    with torch.no_grad():
        out, record = tree_mixer_forward(mixer, hidden, layout, conv_state, ssm_state, prompt=prompt)
        parent_list = parents[0].tolist()
        for node in range(NODES):
            path = path_to(parent_list, node)
            ref_out, ref_conv, ref_ssm = recurrent_reference(mixer, hidden[0, path], conv_state[0], ssm_state[0],
                                                             multipliers, clamp=prompt)
            torch.testing.assert_close(out[0, node], ref_out[-1], rtol=0, atol=1e-10)
            conv, ssm = commit_state(record, torch.tensor([node]))
            torch.testing.assert_close(conv[0], ref_conv, rtol=0, atol=1e-14)
            torch.testing.assert_close(ssm[0], ref_ssm, rtol=0, atol=1e-10)
            padded = torch.tensor([path + [0] * (NODES - len(path))])
            conv, ssm = replay_state(record, padded, torch.tensor([len(path)]))
            torch.testing.assert_close(conv[0], ref_conv, rtol=0, atol=1e-14)
            torch.testing.assert_close(ssm[0], ref_ssm, rtol=0, atol=1e-10)
    if kind == "chain":
        assert int(depth.max()) > CHUNK > KERNEL


def test_conv_windows_cross_from_the_tree_into_the_stored_conv_state():
    parents = torch.tensor([[-1, 0, 0, 1, 3]])
    depth = torch.tensor([[0, 1, 1, 2, 3]])
    layout = TreeLayout.build(parents, depth, ancestor_mask(parents, depth, 3), torch.ones(1, 5, dtype=torch.bool), 4)
    # indices into cat(conv_state[0..3], nodes): history entries 0..3, node i at 4 + i
    assert layout.conv_index[0].tolist() == [[1, 2, 3, 4], [2, 3, 4, 5], [2, 3, 4, 6], [3, 4, 5, 7], [4, 5, 7, 8]]


def test_ragged_chain_skips_left_padding():
    valid = torch.tensor([[False, False, True, True, True], [True, True, True, True, True]])
    layout = TreeLayout.ragged_chain(valid, 4)
    assert layout.depth.tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]
    assert layout.conv_index[0, 4].tolist() == [3, 6, 7, 8]  # one history entry, then the three prompt tokens
    assert not layout.ancestors[0, 4, :2].any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_decay_is_exp_where_kept_and_zero_below_the_floor_or_masked(dtype):
    floor = 0.75 * torch.log(torch.tensor(torch.finfo(dtype).tiny, dtype=torch.float64)).item()
    log_weight = torch.tensor([0.0, -1.5, floor + 1.0, floor - 1.0, -1e4, 50.0, 3.0], dtype=dtype)
    mask = torch.tensor([True, True, True, True, True, False, True])
    out = decay(log_weight, mask)
    expected = torch.where(torch.tensor([True, True, True, False, False, False, True]), log_weight.exp(), 0.0)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    assert torch.isfinite(out).all()  # a masked entry whose exp overflows is 0, not nan
    assert (out[out != 0].abs() >= torch.finfo(dtype).tiny).all()  # no subnormal results


def test_strong_decay_in_float32_matches_the_float64_recurrence():
    """Large step sizes drive exp(L_i - L_s) below float32's normal range along long paths: the floored decays
    (0 instead of subnormals) still give the recurrence's outputs and states to float32 precision."""
    model = tiny_ssm("mamba2")
    mixer = next(m for m in model.modules() if hasattr(m, "A_log"))
    with torch.no_grad():
        mixer.dt_bias.fill_(30.0)  # dt ~ 30: decays exp(-30 A) per step underflow after a few steps
    parents = torch.tensor([list(range(-1, NODES - 1))])  # a chain
    depth = torch.tensor([list(range(NODES))])
    layout = TreeLayout.build(parents, depth, ancestor_mask(parents, depth, NODES - 1),
                              torch.ones_like(parents, dtype=torch.bool), KERNEL)
    gen = torch.Generator().manual_seed(5)
    hidden = torch.randn(1, NODES, model.config.hidden_size, generator=gen, dtype=torch.float64)
    conv_state = torch.randn(1, mixer.conv_dim, KERNEL, generator=gen, dtype=torch.float64)
    ssm_state = torch.randn(1, mixer.num_heads, mixer.head_dim, mixer.ssm_state_size, generator=gen,
                            dtype=torch.float64)
    with torch.no_grad():
        ref_out, _, ref_ssm = recurrent_reference(mixer, hidden[0], conv_state[0], ssm_state[0])
        out, record = tree_mixer_forward(mixer.float(), hidden.float(), layout, conv_state.float(), ssm_state.float())
        assert (record.log_decay[0, :, -1] < 0.75 * torch.log(torch.tensor(torch.finfo(torch.float32).tiny))).all()
        _, ssm = commit_state(record, torch.tensor([NODES - 1]))
    torch.testing.assert_close(out[0].double(), ref_out.double(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(ssm[0].double(), ref_ssm, rtol=1e-4, atol=1e-4)
