"""Training a draft for acceptance: match the target's denoising means, weighted as in the trajectory KL.

For two DDPM heads with the same schedule, KL(draft trajectory || target trajectory) = Σ_t E|μ_q - μ_p|² / (2σ_t²),
and μ differs only through ε: μ_q - μ_p = -β_t / (√(1-ᾱ_t) √α_t) (ε_q - ε_p). Exact CSpD accepts a draft token
with probability 1 - TV(q, p) >= 1 - √(KL/2) (Pinsker), so this loss, on data noised to x_t, targets acceptance.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specmm.image_ar.continuous.model import ContinuousAR


def trajectory_kl_loss(draft: ContinuousAR, target: ContinuousAR, latents: Tensor, labels: Tensor,
                       generator: torch.Generator | None = None, head_repeats: int = 1) -> Tensor:
    """Mean over tokens of the per-step KL term at one random step, times T (an unbiased trajectory-KL estimate)."""
    if draft.config.head != "ddpm" or target.config.head != "ddpm":
        raise ValueError("draft: trajectory-KL distillation needs DDPM heads on both models")
    orders = target.raster_orders(latents.shape[0], latents.device)
    with torch.no_grad():
        z_target = target.features(latents, labels, orders).flatten(0, 1).repeat(head_repeats, 1)  # [M, H]
    z_draft = draft.features(latents, labels, orders).flatten(0, 1).repeat(head_repeats, 1)
    x0 = latents.flatten(0, 1).repeat(head_repeats, 1)  # [M, C]
    head = target.head
    t = torch.randint(1, head.steps + 1, (x0.shape[0],), generator=generator, device=x0.device)
    noise = torch.randn(x0.shape, generator=generator, device=x0.device, dtype=x0.dtype)
    beta, alpha_bar, std = (v[t - 1].to(x0.dtype)[:, None] for v in (head.betas, head.alphas_cumprod, head.stds))
    x_t = alpha_bar.sqrt() * x0 + (1 - alpha_bar).sqrt() * noise
    with torch.no_grad():
        eps_target = head.net(x_t, t, z_target)
    weight = beta**2 / ((1 - alpha_bar) * (1 - beta) * 2 * std**2)  # [M, 1]
    return head.steps * (weight * (draft.head.net(x_t, t, z_draft) - eps_target) ** 2).sum(-1).mean()
