"""Between images and latent token maps, through a diffusers `AutoencoderKL` whose config carries the scaling factor
(latents are scaled to unit std for the AR model, as in latent diffusion)."""

from __future__ import annotations

import torch
from diffusers import AutoencoderKL
from torch import Tensor

from specmm.image_ar.continuous.metrics import to_unit_range


@torch.no_grad()
def encode(vae: AutoencoderKL, images: Tensor, batch_size: int = 256) -> Tensor:
    """uint8 images [N, 3, H, W] -> unscaled latent tokens [N, h*w, C] (posterior means, raster order)."""
    out = [vae.encode(to_unit_range(chunk)).latent_dist.mode() for chunk in images.split(batch_size)]
    return torch.cat(out).flatten(2).transpose(1, 2)


@torch.no_grad()
def decode(vae: AutoencoderKL, tokens: Tensor, batch_size: int = 256) -> Tensor:
    """Scaled latent tokens [N, h*w, C] -> uint8 images [N, 3, H, W]."""
    grid = int(tokens.shape[1] ** 0.5)
    latents = (tokens / vae.config.scaling_factor).transpose(1, 2).reshape(tokens.shape[0], -1, grid, grid)
    images = torch.cat([vae.decode(c.to(vae.dtype)).sample for c in latents.split(batch_size)])
    return ((images.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).cpu()
