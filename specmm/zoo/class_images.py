"""Procedural class-labelled images for the image-generation entries (`imagegen`, continuous-token AR).

Ten classes drawn with the captioner's scene renderer: six single-shape classes (the shape is the class;
colour, size, texture, cell, background and its style vary) and four layouts of several objects (pairs,
rows, corners, diagonals), so a class-conditional model has something to learn and a classifier something
to check. Images are a pure function of (class id, seed, size).
"""

from __future__ import annotations

import random

import numpy as np
import torch
from PIL import Image

from specmm.zoo.scenes import (
    BACKGROUND_STYLES,
    BACKGROUNDS,
    CLASHES,
    COLOURS,
    SHAPES,
    SIZES,
    TEXTURES,
    Scene,
    SceneObject,
    render,
)

LAYOUTS = {  # class name -> (shape, cells)
    "circle pair": ("circle", ((1, 0), (1, 2))),
    "square row": ("square", ((0, 0), (0, 1), (0, 2))),
    "triangle corners": ("triangle", ((0, 0), (0, 2), (2, 0), (2, 2))),
    "star diagonal": ("star", ((0, 0), (1, 1), (2, 2))),
}
CLASSES: tuple[str, ...] = SHAPES + tuple(LAYOUTS)  # 10 class names, index = class id


def class_scene(class_id: int, rng: random.Random) -> Scene:
    """A random scene of class `class_id`."""
    if not 0 <= class_id < len(CLASSES):
        raise ValueError(f"class_id: expected 0..{len(CLASSES) - 1}, got {class_id}")
    background = rng.choice(sorted(BACKGROUNDS))
    colours = [c for c in COLOURS if c not in CLASHES[background]]
    name = CLASSES[class_id]
    if name in LAYOUTS:
        shape, cells = LAYOUTS[name]
        colour, texture = rng.choice(colours), rng.choice(TEXTURES)  # one look for the whole layout
        objects = tuple(SceneObject(cell, shape, colour, "medium", texture) for cell in cells)
    else:
        cell = (rng.randrange(3), rng.randrange(3))
        objects = (SceneObject(cell, name, rng.choice(colours), rng.choice(SIZES[1:]), rng.choice(TEXTURES)),)
    return Scene(objects, background, rng.choice(BACKGROUND_STYLES))


def class_image(class_id: int, seed: int, size: int = 64) -> Image.Image:
    """One RGB image of class `class_id` (size x size); deterministic for (class_id, seed, size)."""
    rng = random.Random(f"{class_id}-{seed}")
    return render(class_scene(class_id, rng), size=size, seed=seed)


def class_dataset(per_class: int, size: int = 64, seed: int = 0,
                  classes: int = len(CLASSES)) -> tuple[torch.Tensor, torch.Tensor]:
    """`per_class` images of each of the first `classes` classes: (uint8 images [N, 3, H, W], labels [N]).

    Different `seed`s give disjoint image sets (train / held-out splits).
    """
    images, labels = [], []
    for class_id in range(classes):
        for i in range(per_class):
            pixels = np.asarray(class_image(class_id, seed * 1_000_003 + i, size))  # [H, W, 3]
            images.append(torch.from_numpy(pixels.copy()).permute(2, 0, 1))
            labels.append(class_id)
    return torch.stack(images), torch.tensor(labels)


__all__ = ["CLASSES", "class_dataset", "class_image", "class_scene"]
