"""Tree-structured Mamba2 mixer in functional PyTorch, reading an HF mixer module's own weights.

Verification runs SSD's quadratic ("attention-like") form with the causal mask replaced by the tree's
ancestor mask and per-path cumulative decay; the committed prefix enters as exp(L) C H0 and each node's
depthwise conv reads its K-1 nearest ancestors, continuing into the stored conv state. Nothing here writes
a cache: `TreeRecord` keeps what `commit_state` needs to produce the accepted node's states in closed form.
This is the reference path (and the CPU one); compiled mode `torch.compile`s these same functions
(`specmm.ssm.steps`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

UNDERFLOW_SHARE = 0.75  # decays below exp(0.75 ln tiny) count as 0: 3.5e-29 in float32 (see `decay`)
MIXER_CLASSES = ("Mamba2Mixer", "BambaMixer", "NemotronHMamba2Mixer", "Zamba2MambaMixer", "FalconH1Mixer",
                 "GraniteMoeHybridMambaLayer")


@dataclass
class TreeLayout:
    """Per-row tree structure. Node i's parent is `parents[i]` < i, or -1 for the committed prefix."""

    ancestors: Tensor  # [B, n, n] bool: (i, s) True when s is i or an ancestor of i (padding nodes: self only)
    depth: Tensor  # [B, n] number of tree ancestors of each node
    conv_index: Tensor  # [B, n, K] conv window of each node, indices into cat(conv_state [K], nodes [n])

    @classmethod
    def build(cls, parents: Tensor, depth: Tensor, ancestors: Tensor, valid: Tensor, kernel: int) -> TreeLayout:
        """From DraftTree-style tensors: parents/depth/valid [B, n], ancestors [B, n, n]."""
        batch, n = parents.shape
        ancestors = tree_attention(ancestors, valid)
        node = torch.arange(n, device=parents.device).expand(batch, n)
        columns = [kernel + node]  # distance 0: the node itself
        ancestor = node
        for distance in range(1, kernel):
            ancestor = parents.gather(1, ancestor.clamp_min(0))  # [B, n] (garbage once past the root; masked)
            in_tree = distance <= depth
            columns.append(torch.where(in_tree, kernel + ancestor.clamp_min(0), kernel + depth - distance))
        conv_index = torch.stack(columns[::-1], dim=-1)  # [B, n, K] oldest first, like F.conv1d's window
        return cls(ancestors=ancestors, depth=depth, conv_index=conv_index)

    @classmethod
    def ragged_chain(cls, valid: Tensor, kernel: int) -> TreeLayout:
        """A left-padded block of certain tokens: each valid entry follows the previous valid one."""
        return cls.build(*chain_tree(valid), valid, kernel)


def tree_attention(ancestors: Tensor, valid: Tensor) -> Tensor:
    """[B, n, n] what each node sees among the tree's: its valid ancestors and itself (padding: itself only)."""
    eye = torch.eye(ancestors.shape[-1], dtype=torch.bool, device=ancestors.device)
    return (ancestors & valid[:, None, :] & valid[:, :, None]) | eye


def chain_tree(valid: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(parents, depth [B, n], ancestors [B, n, n]) of a left-padded block [B, n] of certain tokens: each valid
    entry follows the previous valid one (padding: parent -1, depth 0)."""
    batch, n = valid.shape
    index = torch.arange(n, device=valid.device).expand(batch, n)
    last_valid = torch.where(valid, index, -1).cummax(1).values  # [B, n] last valid index at or before i
    parents = torch.cat([last_valid.new_full((batch, 1), -1), last_valid[:, :-1]], 1)
    depth = (valid.long().cumsum(1) - 1).clamp_min(0)
    parents = torch.where(valid, parents, -1)
    depth = torch.where(valid, depth, 0)
    causal = torch.ones(n, n, dtype=torch.bool, device=valid.device).tril()
    return parents, depth, causal.expand(batch, n, n)


@dataclass
class TreeRecord:
    """What one mixer's verify pass leaves for the commit (all in the scan dtype)."""

    sources: Tensor  # [B, K+n, C] raw (pre-conv) xBC of the committed conv state, then of each node
    conv_index: Tensor  # [B, n, K] each node's conv window: indices into `sources`
    dt: Tensor  # [B, H, n] step sizes after softplus and clamp
    x: Tensor  # [B, H, n, P]
    B: Tensor  # [B, H, n, N] (groups repeated to heads)
    log_decay: Tensor  # [B, H, n] L_i = sum of dt*A over the root->i path
    ancestors: Tensor  # [B, n, n]
    ssm_state: Tensor  # [B, H, P, N] the committed state the pass started from
    A: Tensor  # [H]

    def conv_state(self, node: Tensor) -> Tensor:
        """[B, C, K] the raw conv window of node[b] in row b: the conv state after it."""
        rows = torch.arange(node.shape[0], device=node.device)
        return self.sources[rows[:, None], self.conv_index[rows, node]].transpose(1, 2)


def decay(log_weight: Tensor, mask: Tensor | None = None) -> Tensor:
    """exp(log_weight) where `mask` holds (0 elsewhere), and 0 where it would be below exp(UNDERFLOW_SHARE * ln tiny).

    On the CPU an exp whose result underflows takes a scalar slow path (about 60x), and the subnormal numbers it
    returns slow every product they enter (about 40x); a decay under 1e-28 (float32) is far below the resolution of
    any sum it joins, so it is 0 here."""
    floor = UNDERFLOW_SHARE * math.log(torch.finfo(log_weight.dtype).tiny)
    keep = log_weight > floor
    if mask is not None:
        keep = keep & mask
    return torch.where(keep, log_weight.clamp_min(floor).exp(), 0.0)


def is_mamba2_mixer(module: nn.Module) -> bool:
    return type(module).__name__ in MIXER_CLASSES


def step_sizes(mixer: nn.Module, dt_raw: Tensor, dtype: torch.dtype, clamp: Tensor | bool = True) -> Tensor:
    """softplus(dt + dt_bias) [B, n, H], clamped to the mixer's time_step_limit where `clamp` ([B, n] or one bool).

    HF clamps in its multi-token (chunk) path, which `generate` takes for the whole prompt, and not in its cached
    one-token step (`mamba2_selective_state_update`, as mamba_ssm's `step`), which decodes every later token: so
    prompt tokens are clamped and generated ones are not, as `generate` computes them."""
    dt = F.softplus(dt_raw.to(dtype) + mixer.dt_bias.to(dtype))
    if clamp is False:
        return dt
    low, high = mixer.time_step_limit
    clamped = dt.clamp(min=low, max=high)
    return clamped if clamp is True else torch.where(clamp[..., None], clamped, dt)


def project_inputs(mixer: nn.Module, hidden: Tensor) -> Tensor:
    """The mixer's input projection [B, n, D] -> [B, n, 2I + 2GN + H], with Falcon-H1's mup multipliers
    (`ssm_in_multiplier` on the input, `mup_vector` per projected channel) where the mixer has them."""
    in_multiplier = getattr(mixer, "ssm_in_multiplier", None)
    if in_multiplier is not None:
        hidden = hidden * in_multiplier
    projected = mixer.in_proj(hidden)
    mup_vector = getattr(mixer, "mup_vector", None)
    return projected if mup_vector is None else projected * mup_vector


def gated_output(mixer: nn.Module, y: Tensor, gate: Tensor) -> Tensor:
    """The gated norm of the scan output [B, n, I]; Falcon-H1 without `mamba_rms_norm` gates with silu only."""
    if getattr(mixer, "mamba_rms_norm", True):
        return mixer.norm(y, gate)
    return y * F.silu(gate)


def tree_mixer_forward(mixer: nn.Module, hidden: Tensor, layout: TreeLayout, conv_state: Tensor, ssm_state: Tensor,
                       scan_dtype: torch.dtype | None = None, prompt: Tensor | bool = False
                       ) -> tuple[Tensor, TreeRecord]:
    """Run every tree node through `mixer` after the committed states; returns (out [B, n, D], record).

    hidden: [B, n, D]; conv_state: [B, C, K] raw inputs of the last K committed tokens; ssm_state: [B, H, P, N];
    prompt: which nodes are prompt tokens ([B, n], or one bool for all), whose step sizes are clamped as HF's
    prefill clamps them (`step_sizes`).
    """
    batch, n, _ = hidden.shape
    heads, head_dim, groups, state = mixer.num_heads, mixer.head_dim, mixer.n_groups, mixer.ssm_state_size
    kernel, channels, inner = mixer.conv_kernel_size, mixer.conv_dim, mixer.intermediate_size
    acc = scan_dtype or torch.promote_types(hidden.dtype, torch.float32)

    gate, xbc, dt_raw = project_inputs(mixer, hidden).split([inner, channels, heads], dim=-1)
    # depthwise conv over each node's window: its ancestors, then the committed history
    sources = torch.cat([conv_state.transpose(1, 2).to(xbc.dtype), xbc], dim=1)  # [B, K+n, C]
    rows = torch.arange(batch, device=hidden.device)[:, None]
    weight = mixer.conv1d.weight[:, 0, :].T  # [C, K] -> [K, C]
    # one tap at a time: the [B, n, K, C] windows would be a large temporary (and fresh pages) per layer
    conv = sources[rows, layout.conv_index[..., 0]] * weight[0]  # [B, n, C]
    for tap in range(1, kernel):
        conv = conv + sources[rows, layout.conv_index[..., tap]] * weight[tap]
    if mixer.conv1d.bias is not None:
        conv = conv + mixer.conv1d.bias
    x, b, c = mixer.act(conv).split([inner, groups * state, groups * state], dim=-1)

    # heads first from here on: [B, H, n, .], so every contraction is one batched matmul
    per_group = heads // groups
    x = x.reshape(batch, n, heads, head_dim).transpose(1, 2).to(acc)  # [B, H, n, P]
    b = b.reshape(batch, n, groups, 1, state).expand(-1, -1, -1, per_group, -1).reshape(batch, n, heads, state)
    c = c.reshape(batch, n, groups, 1, state).expand(-1, -1, -1, per_group, -1).reshape(batch, n, heads, state)
    b, c = b.transpose(1, 2).to(acc), c.transpose(1, 2).to(acc)  # [B, H, n, N]
    dt = step_sizes(mixer, dt_raw, acc, clamp=prompt).transpose(1, 2)  # [B, H, n]
    A = -torch.exp(mixer.A_log.float()).to(acc)  # [H] (HF computes A in float32)

    mask = layout.ancestors  # [B, n, n]
    # [B, H, n] = T (dt A) per head, as [B, H, n] @ [B, n, n]: a matrix-vector product ([B, 1, n, n] @ [B, H, n, 1])
    # is decomposed by inductor on CPU into a reduction whose vectorised store overruns its buffer when the heads
    # fill less than a vector (torch 2.11; benchmarks/ssm_batch1_compile_crash.py)
    log_decay = (dt * A[:, None]) @ mask.transpose(-1, -2).to(acc)
    segment = decay(log_decay[..., :, None] - log_decay[..., None, :], mask[:, None])  # [B, H, n, n]
    scores = (c @ b.transpose(-1, -2)) * segment * dt[..., None, :]  # [B, H, n, n]
    y = scores @ x + (c @ ssm_state.to(acc).transpose(-1, -2)) * decay(log_decay)[..., None]  # [B, H, n, P]
    y = y + mixer.D.to(acc)[:, None, None] * x

    y = gated_output(mixer, y.transpose(1, 2).reshape(batch, n, inner).to(hidden.dtype), gate)
    out = mixer.out_proj(y.to(hidden.dtype))
    record = TreeRecord(sources=sources, conv_index=layout.conv_index, dt=dt, x=x, B=b, log_decay=log_decay,
                        ancestors=mask, ssm_state=ssm_state, A=A)
    return out, record


def commit_state(record: TreeRecord, node: Tensor) -> tuple[Tensor, Tensor]:
    """Closed-form states after node `node[b]` of row b ([B]): (conv_state [B, C, K], ssm_state [B, H, P, N]).

    H_j = exp(L_j) H0 + sum over s on the path of exp(L_j - L_s) dt_s x_s B_s^T: no replay, no per-node states.
    """
    batch = node.shape[0]
    rows = torch.arange(batch, device=node.device)
    conv_state = record.conv_state(node)  # [B, C, K]
    on_path = record.ancestors[rows, node]  # [B, n]
    last = record.log_decay.gather(2, node[:, None, None].expand(-1, record.log_decay.shape[1], 1))  # [B, H, 1]
    weights = decay(last - record.log_decay, on_path[:, None, :]) * record.dt  # [B, H, n]
    update = (record.x * weights[..., None]).transpose(-1, -2) @ record.B  # [B, H, P, N]
    ssm_state = decay(last)[..., None] * record.ssm_state.to(weights.dtype) + update
    return conv_state, ssm_state


def replay_state(record: TreeRecord, path: Tensor, counts: Tensor) -> tuple[Tensor, Tensor]:
    """Vanilla rollback: re-run the recurrence over the accepted inputs `path[b, :counts[b]]`, one step each."""
    batch = path.shape[0]
    rows = torch.arange(batch, device=path.device)
    state = record.ssm_state.to(record.x.dtype)
    for step in range(path.shape[1]):
        node = path[:, step]
        active = (step < counts)[:, None, None, None]
        dt, x, b = record.dt[rows, :, node], record.x[rows, :, node], record.B[rows, :, node]  # [B, H], [B, H, P/N]
        advanced = (dt * record.A).exp()[..., None, None] * state + dt[..., None, None] * x[..., None] * b[:, :, None]
        state = torch.where(active, advanced, state)
    last = path.gather(1, (counts - 1)[:, None])[:, 0]
    return record.conv_state(last), state
