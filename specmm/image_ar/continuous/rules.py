"""CSpD acceptance rules for continuous tokens, as pure tensor functions (like diffusers' schedulers).

A rule answers two questions for each drafted token: the log density ratio log p/q that accepts it with
probability min(1, p/q), and how to propose candidates for the residual (p - q)+ / ∫(p - q)+, which the sampler
draws by acceptance-rejection: propose y ~ p, accept with probability (p(y) - q(y))+ / p(y) = 1 - min(1, q/p)(y)
(the bound (p - q)+ <= p, so M = 1). Draft and target use the same noise (trajectory alignment).

- `TrajectoryRule` (exact for any number of denoising steps): the random variable is the whole denoising
  trajectory; its density ratio is the product of the T transition ratios along the draft's trajectory, one
  batched target-head call. Residual candidates are fresh target chains.
- `FinalStepRule` (the CSpD paper's test): the ratio of the final denoising step's Gaussians, the target's taken
  at the end of its own chain run on the draft's noise. Exact when the head has one step (then the trajectory is
  (x_1, x_0) with x_1 shared); an approximation for T > 1, since the marginal density of x_0 is not that
  Gaussian. Residual candidates come from the target's final Gaussian.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from specmm.image_ar.continuous.chain import (
    chain_log_density,
    draw_noise,
    gaussian_log_density,
    sample_chain,
)
from specmm.image_ar.continuous.heads import Head


@dataclass
class Drafts:
    """What the draft produced for k tokens of B rows."""

    noise: Tensor  # [B, k, T+1, C] standard normal noise of each chain (shared with the target)
    trajectory: Tensor  # [B, k, T+1, C] x_T .. x_0; the token is trajectory[..., -1, :]
    log_density: Tensor  # [B, k] draft log density of its trajectory (without the shared x_T factor)
    features: Tensor  # [B, k, H] the draft's z at each drafted step


@dataclass
class Context:
    """Per row, the position where a residual or bonus token is drawn (index j* into the drafts/verified steps)."""

    target_features: Tensor  # [B, H] target z at j*
    draft_features: Tensor  # [B, H] draft z at j* (meaningless where j* = k: bonus rows)
    aligned: tuple[Tensor, Tensor, Tensor, Tensor] | None = None  # FinalStepRule: target/draft final Gaussians

    def rows(self, index: Tensor) -> Context:
        """The context of a subset of rows."""
        aligned = None if self.aligned is None else tuple(x[index] for x in self.aligned)
        return Context(self.target_features[index], self.draft_features[index], aligned)


def _flat(x: Tensor) -> Tensor:
    return x.flatten(0, 1)


class TrajectoryRule:
    name = "trajectory"
    candidates_are_target_samples = True  # a residual candidate is a plain target sample (usable as bonus)

    def log_ratio(self, target: Head, draft: Head, drafts: Drafts, target_features: Tensor,
                  temperature: float) -> tuple[Tensor, None]:
        """log p/q [B, k] of each drafted trajectory, given the target's z [B, k, H] at the drafted steps."""
        b, k = drafts.log_density.shape
        log_target = chain_log_density(target, _flat(target_features), _flat(drafts.trajectory), temperature)
        return log_target.view(b, k) - drafts.log_density, None

    def context(self, target_features: Tensor, draft_features: Tensor, aligned, index: Tensor) -> Context:
        return Context(target_features, draft_features)

    def propose(self, target: Head, draft: Head, ctx: Context, count: int, temperature: float,
                generator: torch.Generator | None) -> tuple[Tensor, Tensor, Tensor]:
        """`count` candidates per row: (tokens [B, m, C], log p [B, m], log q [B, m])."""
        z_target = ctx.target_features.repeat_interleave(count, 0)  # [B*m, H]
        b = ctx.target_features.shape[0]
        noise = draw_noise((b * count,), target, z_target.dtype, z_target.device, generator)
        trajectory, log_target = sample_chain(target, z_target, noise, temperature)
        log_draft = chain_log_density(draft, ctx.draft_features.repeat_interleave(count, 0), trajectory, temperature)
        return trajectory[:, -1].view(b, count, -1), log_target.view(b, count), log_draft.view(b, count)


class FinalStepRule:
    name = "final-step"
    candidates_are_target_samples = False

    def log_ratio(self, target: Head, draft: Head, drafts: Drafts, target_features: Tensor,
                  temperature: float) -> tuple[Tensor, tuple[Tensor, ...]]:
        """log N(x; target final Gaussian) - log N(x; draft final Gaussian) at the drafted tokens x [B, k]."""
        b, k = drafts.log_density.shape
        noise = _flat(drafts.noise)
        aligned, _ = sample_chain(target, _flat(target_features), noise, temperature)  # shared noise
        mean_p, std_p = target.final_transition(aligned, noise, _flat(target_features), temperature)
        mean_q, std_q = draft.final_transition(_flat(drafts.trajectory), noise, _flat(drafts.features), temperature)
        std_p, std_q = (temperature * std_p).expand_as(mean_p), (temperature * std_q).expand_as(mean_q)
        token = _flat(drafts.trajectory)[:, -1]
        ratio = gaussian_log_density(token, mean_p, std_p) - gaussian_log_density(token, mean_q, std_q)
        gaussians = tuple(x.view(b, k, -1) for x in (mean_p, std_p, mean_q, std_q))
        return ratio.view(b, k), gaussians

    def context(self, target_features: Tensor, draft_features: Tensor, aligned, index: Tensor) -> Context:
        rows = torch.arange(index.shape[0], device=index.device)
        picked = tuple(g[rows, index.clamp(max=g.shape[1] - 1)] for g in aligned)  # each [B, C]
        return Context(target_features, draft_features, picked)

    def propose(self, target: Head, draft: Head, ctx: Context, count: int, temperature: float,
                generator: torch.Generator | None) -> tuple[Tensor, Tensor, Tensor]:
        mean_p, std_p, mean_q, std_q = (x[:, None] for x in ctx.aligned)  # [B, 1, C]
        eps = torch.randn((mean_p.shape[0], count, mean_p.shape[-1]), generator=generator, dtype=mean_p.dtype,
                          device=mean_p.device)
        tokens = mean_p + std_p * eps  # [B, m, C]
        return tokens, gaussian_log_density(tokens, mean_p, std_p), gaussian_log_density(tokens, mean_q, std_q)


RULES = {"trajectory": TrajectoryRule, "final-step": FinalStepRule}


def acceptance_probability(log_ratio: Tensor) -> Tensor:
    """min(1, p/q) from log p/q."""
    return log_ratio.clamp(max=0.0).exp()


def residual_acceptance_probability(log_target: Tensor, log_draft: Tensor) -> Tensor:
    """(p - q)+ / p = 1 - min(1, q/p) for a candidate drawn from p."""
    return -torch.expm1((log_draft - log_target).clamp(max=0.0))
