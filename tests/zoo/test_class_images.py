"""The procedural class images: deterministic, distinct splits, every class drawable, bad ids refused."""

import pytest
import torch

from specmm.zoo.class_images import CLASSES, class_dataset, class_image


def test_ten_classes_deterministic_and_seeds_give_disjoint_sets():
    assert len(CLASSES) >= 10
    a, labels = class_dataset(2, size=32, seed=0)
    b, _ = class_dataset(2, size=32, seed=0)
    c, _ = class_dataset(2, size=32, seed=1)
    assert a.shape == (2 * len(CLASSES), 3, 32, 32) and a.dtype == torch.uint8
    assert torch.equal(a, b)
    assert not any(torch.equal(x, y) for x, y in zip(a, c))
    assert labels.tolist() == [k for k in range(len(CLASSES)) for _ in range(2)]


def test_class_id_out_of_range_is_refused():
    with pytest.raises(ValueError, match="class_id"):
        class_image(len(CLASSES), seed=0)
