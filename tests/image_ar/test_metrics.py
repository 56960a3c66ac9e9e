"""FID / KID on timm features: zero-ish for identical sets, larger for shifted ones."""

import timm
import torch

from specmm.image_ar.metrics import TimmFeatures, fid, kid


def test_fid_and_kid_detect_a_shift():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(400, 8, generator=g, dtype=torch.float64)
    b = torch.randn(400, 8, generator=g, dtype=torch.float64)
    shifted = b + 1.0
    assert fid(a, b) < 0.5 < fid(a, shifted)
    same_mean, _ = kid(a, b)
    shifted_mean, _ = kid(a, shifted)
    assert abs(same_mean) < 0.05 < shifted_mean


def test_timm_features_on_uint8_images():
    torch.manual_seed(0)
    features = TimmFeatures(timm.create_model("test_resnet", num_classes=3), size=32)
    images = torch.randint(0, 255, (4, 3, 24, 24), dtype=torch.uint8)
    feats, logits = features(images)
    assert feats.shape[0] == 4 and logits.shape == (4, 3)
