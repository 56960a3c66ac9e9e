"""FID and KID on features of a timm image model, for comparing sets of generated images (small N friendly).

`ImageFeatures` wraps any timm classifier: pooled pre-logit features for FID/KID and its class predictions.
FID is the Fréchet distance of Gaussians fitted to two feature sets; KID is the unbiased MMD² with the cubic
polynomial kernel (x·y/d + 1)^3 (Bińkowski et al.), usable at a few hundred images where FID is biased.
"""

from __future__ import annotations

import json
from pathlib import Path

import timm
import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

CONFIG, WEIGHTS = "classifier.json", "classifier.safetensors"


def frechet_distance(mean_a: Tensor, cov_a: Tensor, mean_b: Tensor, cov_b: Tensor) -> float:
    """|μa - μb|² + tr(Σa + Σb - 2 (Σa^½ Σb Σa^½)^½), in float64 via symmetric eigendecompositions."""
    mean_a, cov_a, mean_b, cov_b = (x.double() for x in (mean_a, cov_a, mean_b, cov_b))
    values, vectors = torch.linalg.eigh(cov_a)
    root_a = vectors @ torch.diag(values.clamp(min=0).sqrt()) @ vectors.T
    cross = torch.linalg.eigvalsh(root_a @ cov_b @ root_a).clamp(min=0).sqrt().sum()
    return float((mean_a - mean_b).square().sum() + cov_a.trace() + cov_b.trace() - 2 * cross)


def fid(features_a: Tensor, features_b: Tensor) -> float:
    """FID between feature sets [Na, D] and [Nb, D]."""
    a, b = features_a.double(), features_b.double()
    return frechet_distance(a.mean(0), torch.cov(a.T), b.mean(0), torch.cov(b.T))


def kid(features_a: Tensor, features_b: Tensor) -> float:
    """Unbiased MMD² with the kernel (x·y/d + 1)^3 between [Na, D] and [Nb, D] (diagonal terms excluded)."""
    a, b = features_a.double(), features_b.double()
    d, na, nb = a.shape[1], a.shape[0], b.shape[0]
    if na < 2 or nb < 2:
        raise ValueError(f"features: KID needs at least 2 samples per set, got {na} and {nb}")
    k_aa, k_bb, k_ab = ((x @ y.T / d + 1) ** 3 for x, y in ((a, a), (b, b), (a, b)))
    return float((k_aa.sum() - k_aa.trace()) / (na * (na - 1)) + (k_bb.sum() - k_bb.trace()) / (nb * (nb - 1))
                 - 2 * k_ab.mean())


def to_unit_range(images: Tensor) -> Tensor:
    """uint8 [N, 3, H, W] -> float [-1, 1]; float input is passed through."""
    return images.float() / 127.5 - 1 if images.dtype == torch.uint8 else images.float()


class ImageFeatures(nn.Module):
    """A timm classifier used as a feature extractor (pre-logit pooled features) and a class predictor."""

    def __init__(self, model_name: str = "test_resnet", num_classes: int = 10):
        super().__init__()
        self.model_name, self.num_classes = model_name, num_classes
        self.net = timm.create_model(model_name, pretrained=False, num_classes=num_classes)

    def forward(self, images: Tensor) -> Tensor:  # [N, 3, H, W] in [-1, 1] -> logits [N, classes]
        return self.net(images)

    @torch.no_grad()
    def features(self, images: Tensor, batch_size: int = 256) -> Tensor:
        """[N, 3, H, W] (uint8 or [-1, 1]) -> [N, D] float64 pooled features."""
        device = next(self.parameters()).device
        out = []
        for chunk in to_unit_range(images).split(batch_size):
            out.append(self.net.forward_head(self.net.forward_features(chunk.to(device)), pre_logits=True))
        return torch.cat(out).double().cpu()

    @torch.no_grad()
    def predict(self, images: Tensor, batch_size: int = 256) -> Tensor:
        device = next(self.parameters()).device
        return torch.cat([self.net(c.to(device)).argmax(-1).cpu() for c in to_unit_range(images).split(batch_size)])

    def save_pretrained(self, folder: str | Path) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / CONFIG).write_text(json.dumps({"model_name": self.model_name, "num_classes": self.num_classes}))
        save_file({k: v.contiguous() for k, v in self.net.state_dict().items()}, folder / WEIGHTS)

    @classmethod
    def from_pretrained(cls, folder: str | Path, device: torch.device | str = "cpu") -> ImageFeatures:
        folder = Path(folder)
        model = cls(**json.loads((folder / CONFIG).read_text()))
        model.net.load_state_dict(load_file(folder / WEIGHTS))
        return model.to(device).eval()
