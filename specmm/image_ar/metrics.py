"""Image-quality metrics on features of any timm model: FID, KID, and class accuracy of a timm classifier."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image
from scipy import linalg
from torch import Tensor, nn


def as_batch(images: list[Image.Image] | Tensor, size: int | None = None) -> Tensor:
    """PIL images or uint8 [N, 3, H, W] -> float [N, 3, H, W] in [0, 1] (resized to `size` if given)."""
    if isinstance(images, Tensor):
        batch = images.float() / 255.0 if images.dtype == torch.uint8 else images.float()
    else:
        batch = torch.stack([torch.from_numpy(np.asarray(im.convert("RGB")).copy()).permute(2, 0, 1)
                             for im in images]).float() / 255.0
    if size is not None and batch.shape[-1] != size:
        batch = nn.functional.interpolate(batch, size=(size, size), mode="bilinear", antialias=True)
    return batch


class TimmFeatures:
    """Pooled penultimate features (and class logits) of a timm model, normalised with its data config."""

    def __init__(self, model: str | nn.Module, size: int | None = None, pretrained: bool = False):
        import timm

        if isinstance(model, str):
            if model not in timm.list_models():
                raise ValueError(f"model: {model!r} is not a timm model name")
            model = timm.create_model(model, pretrained=pretrained)
        self.model = model.eval()
        config = timm.data.resolve_data_config({}, model=model)
        self.mean = torch.tensor(config["mean"])[:, None, None]
        self.std = torch.tensor(config["std"])[:, None, None]
        self.size = size

    @torch.no_grad()
    def __call__(self, images, batch_size: int = 128) -> tuple[Tensor, Tensor]:
        """(features [N, F], logits [N, C]) for PIL images or uint8 [N, 3, H, W]."""
        x = (as_batch(images, self.size) - self.mean) / self.std
        device = next(self.model.parameters()).device
        feats, logits = [], []
        for chunk in x.split(batch_size):
            f = self.model.forward_head(self.model.forward_features(chunk.to(device)), pre_logits=True)
            feats.append(f.double().cpu())
            logits.append(self.model.get_classifier()(f).cpu())
        return torch.cat(feats), torch.cat(logits)


def fid(a: Tensor, b: Tensor) -> float:
    """Frechet distance between Gaussians fitted to feature sets a [N, F] and b [M, F]."""
    mu_a, mu_b = a.mean(0).numpy(), b.mean(0).numpy()
    cov_a, cov_b = np.cov(a.numpy(), rowvar=False), np.cov(b.numpy(), rowvar=False)
    root, _ = linalg.sqrtm(cov_a @ cov_b, disp=False)
    root = root.real
    return float(((mu_a - mu_b) ** 2).sum() + np.trace(cov_a + cov_b - 2 * root))


def kid(a: Tensor, b: Tensor, subsets: int = 50, subset_size: int = 100, seed: int = 0) -> tuple[float, float]:
    """Kernel inception distance (unbiased MMD^2, cubic polynomial kernel): (mean, std) over random subsets."""
    dim = a.shape[1]
    size = min(subset_size, len(a), len(b))
    if size < 2:
        raise ValueError(f"images: KID needs at least 2 images per set, got {len(a)} and {len(b)}")
    g = torch.Generator().manual_seed(seed)
    values = []
    for _ in range(subsets):
        x = a[torch.randperm(len(a), generator=g)[:size]]
        y = b[torch.randperm(len(b), generator=g)[:size]]
        kxx, kyy, kxy = ((x @ x.T) / dim + 1) ** 3, ((y @ y.T) / dim + 1) ** 3, ((x @ y.T) / dim + 1) ** 3
        off = 1 - torch.eye(size, dtype=x.dtype)
        mmd = (kxx * off).sum() / (size * (size - 1)) + (kyy * off).sum() / (size * (size - 1)) - 2 * kxy.mean()
        values.append(float(mmd))
    return float(np.mean(values)), float(np.std(values))


def accuracy(logits: Tensor, labels: Tensor) -> float:
    return float((logits.argmax(-1) == labels).float().mean())
