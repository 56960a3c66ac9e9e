"""The captioner's auxiliary cell labels: one row per image patch, for the 3x3 scene grid and finer patch grids."""

from __future__ import annotations

import pytest
import torch

from specmm.zoo import captioner, scenes
from specmm.zoo.lm_training import LMTrainConfig

def _scene() -> scenes.Scene:
    import random

    return scenes.random_scene(random.Random(3))


def test_the_3x3_labels_name_each_cells_object_row_and_column():
    scene = _scene()
    labels = captioner.cell_labels(scene)
    assert labels.shape == (9, 6)
    assert labels[:, 4].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2] and labels[:, 5].tolist() == [0, 1, 2] * 3
    occupied = {obj.cell: obj for obj in scene.objects}
    for cell in range(9):
        obj = occupied.get((cell // 3, cell % 3))
        names = ("shape", "colour", "size", "texture")
        expected = [captioner.ATTRIBUTES[n].index(getattr(obj, n)) if obj else 0 for n in names]
        assert labels[cell, :4].tolist() == expected


@pytest.mark.parametrize("side", [6, 12])
def test_a_finer_patch_grid_gives_every_patch_its_cells_labels(side):
    scene = _scene()
    coarse, fine = captioner.cell_labels(scene), captioner.cell_labels(scene, side)
    assert fine.shape == (side * side, 6)
    for patch in range(side * side):
        row, column = divmod(patch, side)
        assert torch.equal(fine[patch], coarse[row * 3 // side * 3 + column * 3 // side])


def test_a_patch_grid_the_scene_grid_does_not_divide_is_refused():
    with pytest.raises(ValueError, match="multiple of the scene grid"):
        captioner.cell_labels(_scene(), 4)


def test_the_training_loss_runs_on_a_finer_patch_grid():
    recipe = {**captioner.RECIPES["tiny"], "patch_size": 8}  # 48 px / 8 px: 36 image tokens
    tokenizer = captioner.train_tokenizer(recipe["vocab_size"], recipe["tokenizer_captions"])
    processor = captioner.make_processor(tokenizer, recipe)
    config = LMTrainConfig(seed=0, **recipe["target_train"])
    batch = captioner.caption_batches(processor, recipe, config, with_images=True)(0)
    assert batch["cell_labels"].shape == (config.batch_size, 36, 6)
    assert (batch["input_ids"] == tokenizer.convert_tokens_to_ids(captioner.IMAGE)).sum(1).tolist() == [36] * 2
    training = captioner.CaptionerTraining(captioner.make_target(recipe, tokenizer, 0), tokenizer, 1.0)
    loss = training.loss(batch)
    loss.backward()
    assert loss.isfinite() and training.vision_heads.weight.grad.abs().sum() > 0
