"""Trajectories of a head's Gaussian chain: sampling from given noise, and exact log densities.

A token's trajectory is (x_T, ..., x_0) [M, T+1, C]. Its density under a head given the AR feature z is
N(x_T; 0, I) · Π_t N(x_{t-1}; mean(x_t, t, z), (temperature · std)^2); two heads share the x_T factor, so the
density ratio of a trajectory under target and draft needs only the T transitions — exact for any T.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from specmm.image_ar.continuous.heads import Head


def gaussian_log_density(x: Tensor, mean: Tensor, std: Tensor) -> Tensor:
    """Sum over the last dim of log N(x; mean, std^2)."""
    return (-0.5 * ((x - mean) / std) ** 2 - std.log() - 0.5 * math.log(2 * math.pi)).sum(-1)


def draw_noise(batch: tuple[int, ...], head: Head, dtype: torch.dtype, device: torch.device,
               generator: torch.Generator | None) -> Tensor:
    """Standard normal noise of a chain: [..., T+1, C] (x_T, then the noise of each step T..1)."""
    return torch.randn((*batch, head.steps + 1, head.token_dim), generator=generator, dtype=dtype, device=device)


def sample_chain(head: Head, z: Tensor, noise: Tensor, temperature: float = 1.0) -> tuple[Tensor, Tensor]:
    """Run the chain from `noise` [M, T+1, C] given z [M, H] -> (trajectory [M, T+1, C], log density [M]).

    The log density omits the shared x_T factor (it cancels in every ratio specmm takes).
    """
    return head.sample(z, noise, temperature)


def chain_log_density(head: Head, z: Tensor, trajectory: Tensor, temperature: float = 1.0) -> Tensor:
    """Log density [M] of trajectories [M, T+1, C] under `head` given z [M, H]: one batched head call."""
    m, steps, dim = trajectory.shape[0], head.steps, trajectory.shape[-1]
    t = torch.arange(steps, 0, -1, device=z.device).repeat(m)  # [M*T]: T..1 per row
    mean, std = head.transition(trajectory[:, :-1].reshape(m * steps, dim), t,
                                z.repeat_interleave(steps, 0))  # [M*T, C], [M*T, C or 1]
    logs = gaussian_log_density(trajectory[:, 1:].reshape(m * steps, dim), mean, temperature * std)
    return logs.view(m, steps).sum(-1)
