"""Procedural scenes: captions parse back into exactly the scene's facts; rendering draws what is described."""

from __future__ import annotations

import random

from specmm.zoo import scenes


def test_captions_parse_back_into_the_scenes_facts_exactly():
    for seed in range(2000):
        rng = random.Random(seed)
        scene = scenes.random_scene(rng)
        parsed = scenes.parse(scenes.describe(scene, rng))
        assert parsed.facts == scenes.scene_facts(scene), seed
        assert not parsed.unparsed and all(scenes.relation_holds(scene, r) for r in parsed.relations)


def test_captions_are_60_to_150_words_and_varied():
    lengths, openings, sentences = [], set(), set()
    for seed in range(1000):
        rng = random.Random(seed)
        text = scenes.describe(scenes.random_scene(rng), rng)
        lengths.append(len(text.split()))
        openings.add(" ".join(text.split()[:2]))
        sentences.update(text.split(". "))
    assert 60 <= min(lengths) and max(lengths) <= 150
    assert len(openings) >= 3 and len(sentences) > 2000
    scene = scenes.random_scene(random.Random(0))
    assert len({scenes.describe(scene, random.Random(s)) for s in range(20)}) > 10  # one scene, many captions


def test_rendering_is_deterministic_and_draws_solid_objects_in_their_colour():
    for seed in range(50):
        scene = scenes.random_scene(random.Random(seed))
        image = scenes.render(scene, 96, seed=seed)
        assert image.tobytes() == scenes.render(scene, 96, seed=seed).tobytes()
        for obj in scene.objects:
            if obj.texture == "solid" and obj.shape != "star":
                centre = (int((obj.cell[1] + 0.5) * 32), int((obj.cell[0] + 0.5) * 32))
                assert image.getpixel(centre) == scenes.COLOURS[obj.colour], (seed, obj)


def test_fact_scores_drop_when_a_caption_is_wrong():
    rng = random.Random(3)
    scene = scenes.random_scene(rng)
    caption = scenes.describe(scene, rng)
    assert scenes.fact_scores(caption, scene)[:2] == (1.0, 1.0)
    obj = scene.objects[0]
    other = next(c for c in scenes.COLOURS if c != obj.colour)
    wrong = caption.replace(f" {obj.colour} {obj.shape}", f" {other} {obj.shape}", 1)
    precision, recall, _ = scenes.fact_scores(wrong, scene)
    assert precision < 1.0 and recall < 1.0
