"""Sampling continuous-token images: the target alone (plain AR) and CSpD (draft k tokens, verify in one forward).

CSpD's loop differs from the discrete core loop (tokens are vectors drawn by a denoising chain, acceptance is a
density ratio, the residual is sampled by acceptance-rejection), so it is written here; it keeps the core's
conventions: per-row acceptance with ragged lengths, one generator owning every draw, honest stats.
Neither loop keeps a KV cache: each forward re-reads the committed canvas (N <= a few hundred tokens).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
from torch import Tensor

from specmm.core.finite import check_finite_steps
from specmm.core.stats import ContinuousExtras, GenerationStats
from specmm.image_ar.continuous.chain import draw_noise, sample_chain
from specmm.image_ar.continuous.model import ContinuousAR
from specmm.image_ar.continuous.rules import (
    RULES,
    Drafts,
    acceptance_probability,
    residual_acceptance_probability,
)


@dataclass
class SampleOutput:
    tokens: Tensor  # [B, N, C] in grid (raster) order
    stats: GenerationStats  # with `continuous` extras


def _check_common(model: ContinuousAR, labels: Tensor, temperature: float, name: str = "model") -> None:
    if not isinstance(labels, Tensor) or labels.dim() != 1 or labels.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"labels: expected a 1-D integer tensor of class ids, got {labels!r}")
    if labels.numel() == 0 or labels.min() < 0 or labels.max() >= model.config.num_classes:
        raise ValueError(f"labels: expected class ids in 0..{model.config.num_classes - 1} for the {name}, "
                         f"got {labels.tolist()}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0:
        raise ValueError(f"temperature: expected a number > 0 (scales every denoising std), got {temperature!r}")


def _orders(model: ContinuousAR, batch: int, device, generator) -> Tensor:
    if model.config.order == "random":
        return torch.argsort(torch.rand(batch, model.config.num_tokens, generator=generator, device=device), -1)
    return model.raster_orders(batch, device)


def _to_grid(canvas: Tensor, orders: Tensor) -> Tensor:
    """Tokens in generation order -> grid order."""
    return torch.zeros_like(canvas).scatter(1, orders[..., None].expand_as(canvas), canvas)


def _at(x: Tensor, index: Tensor) -> Tensor:
    """x [B, L, ...] at one step per row, index [B] -> [B, ...]."""
    return x[torch.arange(x.shape[0], device=x.device), index]


def _write(canvas: Tensor, index: Tensor, value: Tensor, where: Tensor) -> Tensor:
    """canvas [B, N, C] with value [B, C] at step index [B] in rows where `where` [B]."""
    current = _at(canvas, index)
    new = torch.where(where[:, None], value, current)
    return canvas.scatter(1, index[:, None, None].expand(-1, 1, canvas.shape[-1]), new[:, None])


@torch.no_grad()
def _ar_steps(model: ContinuousAR, canvas: Tensor, labels: Tensor, orders: Tensor, start: int, stop: int,
              temperature: float, generator, stats: GenerationStats) -> Tensor:
    """Plain AR from step `start` to `stop` (exclusive), every row."""
    rows = canvas.shape[0]
    for i in range(start, stop):
        z = model.features(canvas[:, : i + 1], labels, orders[:, : i + 1])[:, i]  # [B, H]
        noise = draw_noise((rows,), model.head, z.dtype, z.device, generator)
        trajectory, _ = sample_chain(model.head, z, noise, temperature)
        canvas = canvas.clone()
        canvas[:, i] = trajectory[:, -1]
        stats.target_forwards += 1
    _count_ar_steps(stats, rows, stop - start)
    return canvas


def _new_stats(rows: int) -> GenerationStats:
    return GenerationStats(new_tokens_per_row=[0] * rows, target_forwards_per_row=[0] * rows,
                           continuous=ContinuousExtras())


def _count_ar_steps(stats: GenerationStats, rows: int, steps: int) -> None:
    """Every row took part in `steps` target forwards, each committing one token and accepting no draft."""
    stats.new_tokens += rows * steps
    stats.new_tokens_per_row = [n + steps for n in stats.new_tokens_per_row]
    stats.target_forwards_per_row = [f + steps for f in stats.target_forwards_per_row]
    if steps:
        stats.accepted_histogram = [(stats.accepted_histogram or [0])[0] + rows * steps]


@torch.no_grad()
def sample_ar(model: ContinuousAR, labels: Tensor, *, temperature: float = 1.0,
              generator: torch.Generator | None = None) -> SampleOutput:
    """The target alone: one token per forward, each drawn by the head's full chain."""
    _check_common(model, labels, temperature)
    started = time.perf_counter()
    cfg, param = model.config, next(model.parameters())
    orders = _orders(model, labels.shape[0], param.device, generator)
    canvas = torch.zeros(labels.shape[0], cfg.num_tokens, cfg.token_dim, dtype=param.dtype, device=param.device)
    stats = _new_stats(labels.shape[0])
    canvas = _ar_steps(model, canvas, labels.to(param.device), orders, 0, cfg.num_tokens, temperature, generator, stats)
    check_finite_steps(canvas, model, "token values")  # canvas is in generation order
    stats.wall_time_s = time.perf_counter() - started
    return SampleOutput(_to_grid(canvas, orders), stats)


class CSpDSampler:
    """Continuous speculative decoding: the target prefills the first tokens, then the draft proposes
    `draft_tokens` per round, the target verifies them in one forward and each row keeps its accepted prefix
    plus one residual (or bonus) token.

    The residual sampler draws `proposals_per_round` candidates per waiting row in its first round and doubles
    that each round (a rejected row needs 1/TV proposals on average). `max_proposals` bounds it per token; a
    row that exhausts it takes a fresh plain target sample (never a zero token). That fallback moves at most
    TV·(1 - TV)^max_proposals <= 1/(e·(max_proposals+1)) probability mass per token (TV: the draft-target total
    variation); `stats.continuous.fallbacks` counts it.
    """

    def __init__(self, target: ContinuousAR, draft: ContinuousAR, *, draft_tokens: int = 4, prefill_tokens: int = 0,
                 rule: str = "trajectory", max_proposals: int = 1024, proposals_per_round: int = 4):
        t, d = target.config, draft.config
        for name in ("token_dim", "grid", "num_classes", "diffusion_steps", "beta_schedule", "head", "order"):
            if getattr(t, name) != getattr(d, name):
                raise ValueError(f"draft: its {name} {getattr(d, name)!r} differs from the target's "
                                 f"{getattr(t, name)!r}; CSpD needs the same tokens, classes and denoising chain")
        if isinstance(draft_tokens, bool) or not isinstance(draft_tokens, int) or draft_tokens < 1:
            raise ValueError(f"draft_tokens: expected an integer >= 1, got {draft_tokens!r}")
        if not isinstance(prefill_tokens, int) or not 0 <= prefill_tokens <= t.num_tokens:
            raise ValueError(f"prefill_tokens: expected an integer in 0..{t.num_tokens}, got {prefill_tokens!r}")
        if rule not in RULES:
            raise ValueError(f"rule: expected one of {', '.join(RULES)}, got {rule!r}")
        for name, value in (("max_proposals", max_proposals), ("proposals_per_round", proposals_per_round)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected an integer >= 1, got {value!r}")
        self.target, self.draft = target, draft
        self.draft_tokens, self.prefill_tokens = draft_tokens, prefill_tokens
        self.rule = RULES[rule]()
        self.max_proposals, self.proposals_per_round = max_proposals, proposals_per_round

    @torch.no_grad()
    def sample(self, labels: Tensor, *, temperature: float = 1.0,
               generator: torch.Generator | None = None) -> SampleOutput:
        _check_common(self.target, labels, temperature, "target")
        started = time.perf_counter()
        target, cfg, param = self.target, self.target.config, next(self.target.parameters())
        rows, n, k = labels.shape[0], cfg.num_tokens, self.draft_tokens
        labels = labels.to(param.device)
        orders = _orders(target, rows, param.device, generator)
        canvas = torch.zeros(rows, n, cfg.token_dim, dtype=param.dtype, device=param.device)
        stats = _new_stats(rows)
        canvas = _ar_steps(target, canvas, labels, orders, 0, self.prefill_tokens, temperature, generator, stats)
        lengths = torch.full((rows,), self.prefill_tokens, device=param.device)  # committed tokens per row
        steps = torch.arange(n, device=param.device)
        counts = torch.zeros(2, dtype=torch.long, device=param.device)  # drafted, accepted
        row_forwards = torch.zeros(rows, dtype=torch.long, device=param.device)  # verify forwards per row
        histogram = torch.zeros(k + 1, dtype=torch.long, device=param.device)  # [n]: row-rounds accepting n drafts
        while True:
            longest = int(lengths.max())  # one host sync per round: the loop's exit and the forward widths
            if int(lengths.min()) >= n:
                break
            active = lengths < n
            drafts, canvas = self._draft(canvas, labels, orders, lengths, longest, temperature, generator, stats)
            width = min(n, longest + k + 1)
            z_all = target.features(canvas[:, :width], labels, orders[:, :width])  # [B, W, H]
            verified = (lengths[:, None] + torch.arange(k + 1, device=param.device)).clamp(max=width - 1)  # [B, k+1]
            z_target = torch.gather(z_all, 1, verified[..., None].expand(-1, -1, z_all.shape[-1]))  # [B, k+1, H]
            stats.target_forwards += 1

            log_ratio, aligned = self.rule.log_ratio(target.head, self.draft.head, drafts, z_target[:, :k], temperature)
            inside = lengths[:, None] + torch.arange(k, device=param.device) < n  # [B, k]
            uniform = torch.rand(log_ratio.shape, generator=generator, dtype=log_ratio.dtype, device=log_ratio.device)
            accepted = (uniform < acceptance_probability(log_ratio)) & inside
            n_accepted = accepted.long().cumprod(1).sum(1)  # [B]

            needs_token = lengths + n_accepted < n  # a residual (rejected draft) or bonus (all accepted) token
            ctx = self.rule.context(_at(z_target, n_accepted), _at(drafts.features, n_accepted.clamp(max=k - 1)),
                                    aligned, n_accepted)
            token = self._correction(ctx, needs_token, n_accepted == k, temperature, generator, stats)
            position = (lengths + n_accepted).clamp(max=n - 1)
            canvas = _write(canvas, position, token, needs_token)
            new_lengths = torch.minimum(lengths + n_accepted + needs_token.long(), torch.full_like(lengths, n))
            # stats stay on the device until the end
            counts += torch.stack([(torch.minimum(n_accepted + 1, inside.sum(1)) * active).sum(), n_accepted.sum()])
            row_forwards += active.long()
            histogram += (torch.nn.functional.one_hot(n_accepted, k + 1) * active[:, None]).sum(0)
            canvas = torch.where((steps[None, :] < new_lengths[:, None])[..., None], canvas, 0.0)
            lengths = new_lengths
        check_finite_steps(canvas, target, "token values")  # canvas is in generation order
        stats.continuous.drafted, stats.continuous.accepted = counts.tolist()
        stats.target_forwards_per_row = [f + r for f, r in zip(stats.target_forwards_per_row, row_forwards.tolist())]
        stats.new_tokens_per_row = [n] * rows  # every row fills the image
        stats.new_tokens = n * rows
        histogram = histogram.tolist()
        histogram[0] += (stats.accepted_histogram or [0])[0]  # the prefill steps
        stats.accepted_histogram = histogram
        stats.wall_time_s = time.perf_counter() - started
        return SampleOutput(_to_grid(canvas, orders), stats)

    def _draft(self, canvas, labels, orders, lengths, longest, temperature, generator, stats):
        """k draft tokens per row, written into a copy of the canvas; returns (Drafts, canvas)."""
        draft, n, k = self.draft, canvas.shape[1], self.draft_tokens
        noise, trajectories, log_densities, features = [], [], [], []
        for j in range(k):
            width = min(n, longest + j + 1)
            position = (lengths + j).clamp(max=width - 1)  # [B]
            z = _at(draft.features(canvas[:, :width], labels, orders[:, :width]), position)  # [B, H]
            eps = draw_noise((canvas.shape[0],), draft.head, z.dtype, z.device, generator)
            trajectory, log_density = sample_chain(draft.head, z, eps, temperature)
            canvas = _write(canvas, position, trajectory[:, -1], lengths + j < n)
            noise.append(eps), trajectories.append(trajectory), log_densities.append(log_density), features.append(z)
            stats.draft_forwards += 1
        drafts = Drafts(torch.stack(noise, 1), torch.stack(trajectories, 1), torch.stack(log_densities, 1),
                        torch.stack(features, 1))
        return drafts, canvas

    def _correction(self, ctx, needs_token: Tensor, bonus: Tensor, temperature, generator, stats) -> Tensor:
        """One token per row: a plain target sample for bonus rows, a residual draw for rejected rows."""
        target, draft, rule = self.target.head, self.draft.head, self.rule
        token = torch.zeros(needs_token.shape[0], target.token_dim, dtype=ctx.target_features.dtype,
                            device=ctx.target_features.device)
        todo = needs_token.clone()
        if not rule.candidates_are_target_samples and bool((todo & bonus).any()):
            token = torch.where((todo & bonus)[:, None], self._target_sample(ctx, temperature, generator), token)
            todo &= ~bonus
        proposals, per_round = 0, self.proposals_per_round
        while proposals < self.max_proposals and bool(todo.any()):
            rows = todo.nonzero().squeeze(1)  # only rows still waiting draw candidates
            residual = ~bonus[rows]  # rows drawing from the residual (the rest take one plain target sample)
            count = min(per_round if bool(residual.any()) else 1, self.max_proposals - proposals)
            candidates, log_target, log_draft = rule.propose(target, draft, ctx.rows(rows), count, temperature,
                                                             generator)  # [R, m, C], [R, m], [R, m]
            uniform = torch.rand(log_target.shape, generator=generator, dtype=log_target.dtype,
                                 device=log_target.device)
            ok = uniform < residual_acceptance_probability(log_target, log_draft)  # [R, m]
            if rule.candidates_are_target_samples:
                ok[:, 0] |= bonus[rows]  # a bonus row takes its first candidate: a plain target sample
            take = ok.any(1)  # [R]
            token[rows] = torch.where(take[:, None], _at(candidates, ok.long().argmax(1)), token[rows])
            todo[rows] = ~take
            proposals += count
            per_round = min(2 * per_round, 64)  # rows still waiting have a small residual mass: draw more at once
            stats.continuous.residual_proposals += count * int(residual.sum())
        if bool(todo.any()):
            stats.continuous.fallbacks += int(todo.sum())
            token = torch.where(todo[:, None], self._target_sample(ctx, temperature, generator), token)
        return token

    def _target_sample(self, ctx, temperature, generator) -> Tensor:
        z = ctx.target_features
        noise = draw_noise((z.shape[0],), self.target.head, z.dtype, z.device, generator)
        return sample_chain(self.target.head, z, noise, temperature)[0][:, -1]


def expected_prefill(num_tokens: int, ratio: float) -> int:
    """CSpD's pre-filling: the first ceil(ratio * N) tokens come from the target."""
    return min(num_tokens, math.ceil(ratio * num_tokens))
