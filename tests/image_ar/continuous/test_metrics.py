"""FID and KID: the Fréchet distance matches its closed form; KID is unbiased (≈ 0 for equal laws)."""

from __future__ import annotations

import pytest
import torch

from specmm.image_ar.continuous.metrics import ImageFeatures, fid, frechet_distance, kid


def test_frechet_distance_matches_the_closed_form_for_diagonal_covariances():
    mean_a, mean_b = torch.tensor([0.0, 1.0, 2.0]), torch.tensor([1.0, 1.0, 0.0])
    var_a, var_b = torch.tensor([1.0, 4.0, 0.25]), torch.tensor([4.0, 1.0, 1.0])
    expected = (mean_a - mean_b).square().sum() + (var_a.sqrt() - var_b.sqrt()).square().sum()
    assert frechet_distance(mean_a, torch.diag(var_a), mean_b, torch.diag(var_b)) == pytest.approx(float(expected))


def test_fid_and_kid_separate_a_shift_from_an_independent_sample():
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(2000, 4, generator=gen), torch.randn(2000, 4, generator=gen)
    assert fid(a, a) == pytest.approx(0.0, abs=1e-8)
    assert fid(a, b) < 0.02 and abs(kid(a, b)) < 0.01
    assert fid(a, b + 0.5) > 0.9 and kid(a, b + 0.5) > 0.05


def test_image_features_round_trip(tmp_path):
    torch.manual_seed(0)
    model = ImageFeatures("test_resnet", num_classes=3).eval()
    images = torch.randint(0, 256, (4, 3, 16, 16), dtype=torch.uint8)
    model.save_pretrained(tmp_path)
    loaded = ImageFeatures.from_pretrained(tmp_path)
    torch.testing.assert_close(loaded.features(images), model.features(images))
    assert loaded.features(images).shape == (4, model.net.num_features)
