"""Image tensors to PIL images and grids: the library's own helpers, shared by samplers, the CLI and benchmarks."""

from __future__ import annotations

import torch
from PIL import Image


def to_pil(images: torch.Tensor) -> list[Image.Image]:
    """uint8 [N, 3, H, W] (or float in [-1, 1]) -> PIL images."""
    if images.dtype != torch.uint8:
        images = ((images.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    return [Image.fromarray(image.permute(1, 2, 0).cpu().numpy()) for image in images]


def image_grid(images: list[Image.Image], columns: int) -> Image.Image:
    """Paste PIL images into one grid image (row-major)."""
    width, height = images[0].size
    rows = (len(images) + columns - 1) // columns
    grid = Image.new("RGB", (columns * width, rows * height), "white")
    for i, image in enumerate(images):
        grid.paste(image, ((i % columns) * width, (i // columns) * height))
    return grid


__all__ = ["image_grid", "to_pil"]
