"""Per-token heads of a continuous-token AR model: a short-schedule DDPM denoiser and a one-step Gaussian.

Both are Markov chains of Gaussian transitions `x_{t-1} ~ N(mean(x_t, t, z), std(t, z)^2)`, t = T..1, started
from `x_T ~ N(0, I)` and ending at the token `x_0`; `transition` exposes each step's Gaussian so samplers can
share noise between models and compute exact trajectory densities (see `chain.py`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from diffusers import DDPMScheduler
from torch import Tensor, nn

from specmm.core.compiled import inductor_options


class AdaLNBlock(nn.Module):
    """Residual MLP block whose LayerNorm shift/scale/gate come from the condition (MAR's SimpleMLPAdaLN block)."""

    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width, elementwise_affine=False)
        self.mlp = nn.Sequential(nn.Linear(width, width), nn.SiLU(), nn.Linear(width, width))
        self.modulation = nn.Linear(width, 3 * width)
        nn.init.zeros_(self.modulation.weight)
        nn.init.zeros_(self.modulation.bias)

    def modulate(self, cond: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(shift, 1 + scale, 1 + gate) from the condition, each [..., W]."""
        shift, scale, gate = self.modulation(F.silu(cond)).chunk(3, dim=-1)
        return shift, scale + 1, gate + 1

    def apply(self, h: Tensor, shift: Tensor, scale: Tensor, gate: Tensor) -> Tensor:
        """h + gate · mlp(norm(h) · scale + shift), in functional calls (module calls dominate at small batch)."""
        first, second = self.mlp[0], self.mlp[2]
        x = torch.addcmul(shift, F.layer_norm(h, h.shape[-1:], eps=self.norm.eps), scale)
        hidden = F.silu(F.linear(x, first.weight, first.bias))
        return torch.addcmul(h, gate, F.linear(hidden, second.weight, second.bias))

    def forward(self, h: Tensor, cond: Tensor) -> Tensor:
        return self.apply(h, *self.modulate(cond))


class DenoiserMLP(nn.Module):
    """out(x, t, z): an MLP over a token of width `token_dim`, conditioned on step `t` and the AR feature `z`."""

    def __init__(self, token_dim: int, cond_dim: int, width: int, depth: int, steps: int, out_dim: int):
        super().__init__()
        self.inp = nn.Linear(token_dim, width)
        self.cond = nn.Linear(cond_dim, width)
        self.step = nn.Embedding(steps + 1, width)
        self.blocks = nn.ModuleList(AdaLNBlock(width) for _ in range(depth))
        self.out = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, out_dim))

    def forward(self, x: Tensor, t: Tensor, z: Tensor) -> Tensor:  # [M, C], [M], [M, H] -> [M, out]
        cond = self.cond(z) + self.step(t)
        h = self.inp(x)
        for block in self.blocks:
            h = block(h, cond)
        return self.out(h)

    def chain_modulations(self, z: Tensor) -> list[tuple[Tensor, Tensor, Tensor]]:
        """Per block, the modulations of every step T..1 of a chain at once (each [M, T, W]): a chain then
        runs only the token path per step, which is what costs at small batch (many tiny ops)."""
        steps = torch.arange(self.step.num_embeddings - 1, 0, -1, device=z.device)  # T..1
        cond = self.cond(z)[:, None] + self.step(steps)  # [M, T, W]
        return [block.modulate(cond) for block in self.blocks]

    def denoise(self, x: Tensor, modulations: list[tuple[Tensor, Tensor, Tensor]], index: int) -> Tensor:
        """forward(x, t, z) at chain step `index` (t = T - index), from `chain_modulations(z)`."""
        h = F.linear(x, self.inp.weight, self.inp.bias)
        for block, (shift, scale, gate) in zip(self.blocks, modulations):
            h = block.apply(h, shift[:, index], scale[:, index], gate[:, index])
        norm, out = self.out
        h = F.layer_norm(h, h.shape[-1:], norm.weight, norm.bias, norm.eps)
        return F.linear(h, out.weight, out.bias)


class DDPMHead(nn.Module):
    """DDPM over one token with a short cosine schedule (diffusers' `DDPMScheduler` betas) and ε-prediction.

    Transition variances are the posterior variances β̃_t, with β̃_1 clipped to β̃_2 (improved-DDPM's choice,
    since β̃_1 = 0), so every step, the last one included, is a proper Gaussian; with T = 1 the variance is β_1.
    """

    def __init__(self, token_dim: int, cond_dim: int, width: int, depth: int, steps: int,
                 beta_schedule: str = "squaredcos_cap_v2"):
        super().__init__()
        self.steps, self.token_dim = steps, token_dim
        self.net = DenoiserMLP(token_dim, cond_dim, width, depth, steps, token_dim)
        betas = DDPMScheduler(num_train_timesteps=steps, beta_schedule=beta_schedule).betas.double()  # [T]
        alphas_cumprod = torch.cumprod(1 - betas, 0)
        previous = torch.cat([torch.ones(1, dtype=torch.float64), alphas_cumprod[:-1]])
        variance = betas * (1 - previous) / (1 - alphas_cumprod)
        variance = betas.clone() if steps == 1 else torch.cat([variance[1:2], variance[1:]])
        # per step t (index t - 1): mean = keep * x_t - eps_scale * eps, the DDPM posterior mean under ε-prediction
        keeps, eps_scales = (1 - betas).rsqrt(), betas / ((1 - alphas_cumprod).sqrt() * (1 - betas).sqrt())
        for name, value in {"betas": betas, "alphas_cumprod": alphas_cumprod, "stds": variance.sqrt(),
                            "keeps": keeps, "eps_scales": eps_scales}.items():
            self.register_buffer(name, value, persistent=False)  # float64: cast per use
        # the same, as Python floats, for `sample` (every row of a chain is at the same step)
        self._steps = [(float(a), float(b), float(c)) for a, b, c in zip(keeps, eps_scales, variance.sqrt())]

    def transition(self, x_t: Tensor, t: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
        """Gaussian of x_{t-1} given x_t: (mean [M, C], std [M, 1])."""
        keep, eps_scale, std = (v[t - 1].to(x_t.dtype)[:, None] for v in (self.keeps, self.eps_scales, self.stds))
        return keep * x_t - eps_scale * self.net(x_t, t, z), std

    def sample(self, z: Tensor, noise: Tensor, temperature: float = 1.0) -> tuple[Tensor, Tensor]:
        """The chain from noise [M, T+1, C] given z [M, H] -> (trajectory [M, T+1, C], log density [M]).

        Same math as T calls of `transition`, with the step conditions computed once; the log density (without
        the shared x_T factor) is read off the noise, since x_{t-1} = mean + std · noise exactly.
        """
        modulations = self.net.chain_modulations(z)
        x = noise[:, 0]
        states, log_std = [x], 0.0
        for index, t in enumerate(range(self.steps, 0, -1)):
            keep, eps_scale, std = self._steps[t - 1]
            eps = self.net.denoise(x, modulations, index)
            x = torch.add(x * keep, eps, alpha=-eps_scale).add_(noise[:, index + 1], alpha=temperature * std)
            states.append(x)
            log_std += math.log(temperature * std)
        constant = self.token_dim * (log_std + 0.5 * self.steps * math.log(2 * math.pi))
        return torch.stack(states, 1), -0.5 * noise[:, 1:].square().sum((1, 2)) - constant

    def final_transition(self, trajectory: Tensor, noise: Tensor, z: Tensor, temperature: float = 1.0
                         ) -> tuple[Tensor, Tensor]:
        """The last step's Gaussian (mean [M, C], std [M, 1]) of a chain `sample` ran from `noise` [M, T+1, C]:
        read off x_0 = mean + temperature · std_1 · noise_1, so no network call (std_1 does not depend on z)."""
        std = self._steps[0][2]
        mean = torch.add(trajectory[:, -1], noise[:, -1], alpha=-temperature * std)
        return mean, torch.full_like(mean[:, :1], std)

    def loss(self, x0: Tensor, z: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """ε-prediction MSE at a uniformly drawn step per token (x0 [M, C], z [M, H])."""
        t = torch.randint(1, self.steps + 1, (x0.shape[0],), generator=generator, device=x0.device)
        noise = torch.randn(x0.shape, generator=generator, device=x0.device, dtype=x0.dtype)
        alpha_bar = self.alphas_cumprod[t - 1].to(x0.dtype)[:, None]
        x_t = alpha_bar.sqrt() * x0 + (1 - alpha_bar).sqrt() * noise
        return F.mse_loss(self.net(x_t, t, z), noise)


class GaussianHead(nn.Module):
    """One step: x_0 ~ N(mean(z), diag std(z)^2), ignoring x_1; its densities are exact, which tests rely on."""

    def __init__(self, token_dim: int, cond_dim: int, width: int, depth: int):
        super().__init__()
        self.steps, self.token_dim = 1, token_dim
        self.net = DenoiserMLP(token_dim, cond_dim, width, depth, 1, 2 * token_dim)

    def transition(self, x_t: Tensor, t: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
        mean, log_std = self.net(torch.zeros_like(x_t), t, z).chunk(2, dim=-1)
        return mean, log_std.clamp(-7.0, 3.0).exp()

    def sample(self, z: Tensor, noise: Tensor, temperature: float = 1.0) -> tuple[Tensor, Tensor]:
        """x_0 = mean + temperature · std · noise[:, 1] -> (trajectory [M, 2, C], log density [M])."""
        ones = torch.ones(z.shape[0], dtype=torch.long, device=z.device)
        mean, std = self.transition(noise[:, 0], ones, z)
        std = temperature * std
        x = mean + std * noise[:, 1]
        log_density = (-0.5 * noise[:, 1].square() - std.log() - 0.5 * math.log(2 * math.pi)).sum(-1)
        return torch.stack([noise[:, 0], x], 1), log_density

    def final_transition(self, trajectory: Tensor, noise: Tensor, z: Tensor, temperature: float = 1.0
                         ) -> tuple[Tensor, Tensor]:
        """The one step's Gaussian (mean, std [M, C]); its std depends on z, so this is a network call."""
        return self.transition(trajectory[:, 0], torch.ones(z.shape[0], dtype=torch.long, device=z.device), z)

    def loss(self, x0: Tensor, z: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Gaussian negative log-likelihood per dimension."""
        mean, std = self.transition(x0, torch.ones(x0.shape[0], dtype=torch.long, device=x0.device), z)
        return (0.5 * ((x0 - mean) / std) ** 2 + std.log() + 0.5 * math.log(2 * math.pi)).mean()


Head = DDPMHead | GaussianHead


def compile_chain(head: Head) -> Head:
    """Route `head.sample` through `torch.compile`: at small batch a chain is a hundred-odd tiny ops whose dispatch,
    not arithmetic, sets its latency; compiled (C++ wrapper on a machine without CUDA, so no Python per kernel), a
    depth-3 T=4 chain takes 0.3 ms instead of 1.4 ms on a CPU core. The first row count is compiled static, a second
    one makes it dynamic. Same math; results agree with the eager chain to float rounding. Returns the head."""
    from specmm.core import compiled

    inductor = compiled.BACKEND == "inductor"  # compiled mode's backend and wrapper choice
    head.sample = torch.compile(head.sample, backend=compiled.BACKEND,
                                options=inductor_options(None) if inductor else None)
    return head
