"""Procedural scenes for the `captioner` entry: Pillow drawings with long captions that parse back into facts.

A scene puts 1-5 objects on a 3x3 grid (at most one per cell) over a plain, shaded or speckled background.
Each object has a shape, colour, size and texture. `describe` writes a varied, grammatical caption of
60-150 words from the scene; `parse` reads the facts back out of any caption written in that grammar, so
a model's generated captions can be scored by fact precision and recall.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from PIL import Image, ImageDraw

SHAPES = ("circle", "square", "triangle", "diamond", "cross", "star")
COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 80, 220), "yellow": (240, 210, 40),
           "purple": (140, 60, 190), "orange": (245, 140, 30), "pink": (240, 120, 180), "white": (250, 250, 250),
           "black": (20, 20, 20)}
BACKGROUNDS = {"grey": (150, 150, 150), "cream": (238, 228, 200), "teal": (60, 130, 130),
               "navy": (30, 40, 90), "olive": (120, 120, 60)}
CLASHES = {"grey": {"white", "black"}, "cream": {"white", "yellow"}, "teal": {"green", "blue"},
           "navy": {"black", "blue", "purple"}, "olive": {"green", "yellow", "orange"}}
BACKGROUND_STYLES = ("plain", "shaded", "speckled")
SIZES = ("small", "medium", "large")
TEXTURES = ("solid", "striped", "outlined")
ROWS, COLUMNS = ("top", "middle", "bottom"), ("left", "centre", "right")
NUMBERS = ("no", "one", "two", "three", "four", "five")

# ------------------------------------------------------------------------------------------ the grammar
SIZE_WORDS = {"small": ("small", "little"), "medium": ("medium-sized",), "large": ("large", "big")}
TEXTURE_WORDS = {"solid": ("solid", "filled"), "striped": ("striped",), "outlined": ("outlined", "hollow")}
CELL_PHRASES = {
    (0, 0): ("in the top left corner",), (0, 1): ("at the top in the centre", "in the middle of the top row"),
    (0, 2): ("in the top right corner",), (1, 0): ("on the left side", "in the middle of the left edge"),
    (1, 1): ("right in the centre", "in the very middle"),
    (1, 2): ("on the right side", "in the middle of the right edge"),
    (2, 0): ("in the bottom left corner",), (2, 1): ("at the bottom in the centre", "in the middle of the bottom row"),
    (2, 2): ("in the bottom right corner",),
}
STYLE_WORDS = {"plain": ("plain",), "shaded": ("softly shaded",), "speckled": ("speckled",)}


@dataclass(frozen=True)
class SceneObject:
    cell: tuple[int, int]  # (row, column)
    shape: str
    colour: str
    size: str
    texture: str

    @property
    def name(self) -> str:
        return f"{self.colour} {self.shape}"


@dataclass(frozen=True)
class Scene:
    objects: tuple[SceneObject, ...]
    background: str
    style: str


def random_scene(rng: random.Random) -> Scene:
    """1-5 objects in distinct cells; colour+shape pairs are unique so 'the red circle' names one object."""
    background = rng.choice(sorted(BACKGROUNDS))
    colours = [c for c in COLOURS if c not in CLASHES[background]]
    cells = rng.sample([(r, c) for r in range(3) for c in range(3)], rng.randint(1, 5))
    objects, names = [], set()
    for cell in sorted(cells):
        while True:
            shape, colour = rng.choice(SHAPES), rng.choice(colours)
            if (colour, shape) not in names:
                names.add((colour, shape))
                break
        objects.append(SceneObject(cell, shape, colour, rng.choice(SIZES), rng.choice(TEXTURES)))
    return Scene(tuple(objects), background, rng.choice(BACKGROUND_STYLES))


# ------------------------------------------------------------------------------------------ rendering

def _outline(shape: str, cx: float, cy: float, r: float) -> list[tuple[float, float]] | None:
    import math

    if shape == "square":
        return [(cx - r, cy - r), (cx + r, cy - r), (cx + r, cy + r), (cx - r, cy + r)]
    if shape == "triangle":
        return [(cx, cy - r), (cx + r, cy + r * 0.8), (cx - r, cy + r * 0.8)]
    if shape == "diamond":
        return [(cx, cy - r), (cx + r, cy), (cx, cy + r), (cx - r, cy)]
    if shape == "cross":
        w = r * 0.4
        return [(cx - w, cy - r), (cx + w, cy - r), (cx + w, cy - w), (cx + r, cy - w), (cx + r, cy + w),
                (cx + w, cy + w), (cx + w, cy + r), (cx - w, cy + r), (cx - w, cy + w), (cx - r, cy + w),
                (cx - r, cy - w), (cx - w, cy - w)]
    if shape == "star":
        return [(cx + (r if i % 2 == 0 else r * 0.45) * math.cos(-math.pi / 2 + i * math.pi / 5),
                 cy + (r if i % 2 == 0 else r * 0.45) * math.sin(-math.pi / 2 + i * math.pi / 5)) for i in range(10)]
    return None  # circle


def render(scene: Scene, size: int = 96, seed: int = 0) -> Image.Image:
    """Draw the scene (RGB, size x size). `seed` only varies speckle noise and small jitter."""
    rng = random.Random(seed)
    base = BACKGROUNDS[scene.background]
    image = Image.new("RGB", (size, size), base)
    draw = ImageDraw.Draw(image)
    if scene.style == "shaded":
        for y in range(size):
            k = 0.75 + 0.5 * y / size
            draw.line([(0, y), (size, y)], fill=tuple(min(255, int(v * k)) for v in base))
    elif scene.style == "speckled":
        for _ in range(size * size // 12):
            x, y = rng.randrange(size), rng.randrange(size)
            shade = rng.choice((0.7, 1.3))
            draw.point((x, y), fill=tuple(min(255, int(v * shade)) for v in base))
    cell = size / 3
    radius = {"small": 0.26, "medium": 0.34, "large": 0.44}
    for obj in scene.objects:
        r = radius[obj.size] * cell
        cx = (obj.cell[1] + 0.5) * cell + rng.uniform(-1, 1)
        cy = (obj.cell[0] + 0.5) * cell + rng.uniform(-1, 1)
        colour = COLOURS[obj.colour]
        mask = Image.new("L", (size, size), 0)
        shape_draw = ImageDraw.Draw(mask)
        points = _outline(obj.shape, cx, cy, r)
        width = max(2, size // 48)
        fill, outline = (255, 0) if obj.texture != "outlined" else (0, 255)
        if points is None:
            shape_draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill, outline=outline, width=width)
        else:
            shape_draw.polygon(points, fill=fill, outline=outline, width=width)
        if obj.texture == "striped":
            stripe = max(2, size // 48)
            for y in range(int(cy - r), int(cy + r) + 1):
                if (y // stripe) % 2:
                    shape_draw.line([(cx - r - 1, y), (cx + r + 1, y)], fill=0)
            if points is None:  # keep the silhouette readable
                shape_draw.ellipse([cx - r, cy - r, cx + r, cy + r], outline=255, width=1)
            else:
                shape_draw.polygon(points, outline=255, width=1)
        image.paste(Image.new("RGB", (size, size), colour), (0, 0), mask)
    return image


# ------------------------------------------------------------------------------------------ captions

def _count_phrase(n: int, noun: str) -> str:
    return f"{NUMBERS[n]} {noun}{'' if n == 1 else 's'}"


def _a(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _object_sentence(obj: SceneObject, rng: random.Random) -> str:
    size, texture = rng.choice(SIZE_WORDS[obj.size]), rng.choice(TEXTURE_WORDS[obj.texture])
    where = rng.choice(CELL_PHRASES[obj.cell])
    where = where.capitalize()
    templates = (  # the place comes first: a reader (or a model) knows where to look before the attributes
        f"{where} there is {_a(size)} {size} {obj.colour} {obj.shape} that is {texture}.",
        f"{where} sits {_a(size)} {size} {texture} {obj.colour} {obj.shape}.",
        f"{where} we can see {_a(size)} {size} {obj.colour} {obj.shape}, and it is {texture}.",
        f"Looking {where.lower()}, one finds {_a(obj.colour)} {obj.colour} {obj.shape} that is {size} and {texture}.",
    )
    return rng.choice(templates)


def _relation_sentences(scene: Scene, rng: random.Random, limit: int) -> list[str]:
    pairs = []
    for a in scene.objects:
        for b in scene.objects:
            if a.cell[1] < b.cell[1]:
                pairs.append(rng.choice((f"The {a.name} is to the left of the {b.name}.",
                                         f"The {b.name} is to the right of the {a.name}.")))
            if a.cell[0] < b.cell[0]:
                pairs.append(rng.choice((f"The {a.name} is above the {b.name}.",
                                         f"The {b.name} is below the {a.name}.")))
    rng.shuffle(pairs)
    return pairs[:limit]


def _line_sentence(kind: str, name: str, count: int, rng: random.Random) -> str:
    if count == 0:
        return rng.choice((f"The {name} {kind} is empty.", f"Nothing sits in the {name} {kind}."))
    return rng.choice((f"The {name} {kind} holds {_count_phrase(count, 'object')}.",
                       f"There {'is' if count == 1 else 'are'} {_count_phrase(count, 'object')} in the {name} {kind}."))


def describe(scene: Scene, rng: random.Random) -> str:
    """A 60-150 word caption: overview, one sentence per object, relations, rows and columns, a closing line."""
    n = len(scene.objects)
    style = rng.choice(STYLE_WORDS[scene.style])
    opening = rng.choice((
        f"The picture shows {_count_phrase(n, 'object')} on a {style} {scene.background} background.",
        f"This image contains {_count_phrase(n, 'shape')} drawn on a {style} {scene.background} background.",
        f"Against a {style} {scene.background} background, there {'is' if n == 1 else 'are'} "
        f"{_count_phrase(n, 'object')} in this picture.",
    ))
    objects = [_object_sentence(o, rng) for o in scene.objects]  # reading order: top row first, left to right
    lines = [_line_sentence("row", ROWS[r], sum(o.cell[0] == r for o in scene.objects), rng) for r in range(3)]
    lines += [_line_sentence("column", COLUMNS[c], sum(o.cell[1] == c for o in scene.objects), rng) for c in range(3)]
    closing = rng.choice(("Nothing else appears in the picture.", "There is nothing else to see.",
                          "No other objects are visible."))
    if n == 1:
        closing = rng.choice(("It is the only thing drawn in the picture.", "It stands alone in the picture.")) + \
            " " + closing
    relations = _relation_sentences(scene, rng, {4: 2, 5: 0}.get(n, 3))  # keeps captions within 150 words
    return " ".join([opening, *objects, *relations, *lines, closing])


# ------------------------------------------------------------------------------------------ parsing

def scene_facts(scene: Scene) -> set[tuple]:
    """The checkable facts of a scene: count, background, every object's attributes, row and column counts."""
    facts = {("count", len(scene.objects)), ("background", scene.background), ("style", scene.style)}
    for o in scene.objects:
        facts |= {("shape", o.cell, o.shape), ("colour", o.cell, o.colour), ("size", o.cell, o.size),
                  ("texture", o.cell, o.texture)}
    for i in range(3):
        facts.add(("row", i, sum(o.cell[0] == i for o in scene.objects)))
        facts.add(("column", i, sum(o.cell[1] == i for o in scene.objects)))
    return facts


def _lookup(words: dict[str, tuple[str, ...]]) -> dict[str, str]:
    return {w: key for key, ws in words.items() for w in ws}


_SIZE, _TEXTURE, _STYLE = _lookup(SIZE_WORDS), _lookup(TEXTURE_WORDS), _lookup(STYLE_WORDS)
_CELL = {phrase: cell for cell, phrases in CELL_PHRASES.items() for phrase in phrases}
_NUMBER = {w: i for i, w in enumerate(NUMBERS)}
_RELATION = re.compile(r"^the (\w+) (\w+) is (to the left of|to the right of|above|below) the (\w+) (\w+)$")
_LINE = re.compile(r"(row|column)")


def _find(sentence: str, table: dict[str, object]) -> list:
    found = []
    for phrase in sorted(table, key=len, reverse=True):
        pattern = rf"\b{re.escape(phrase)}\b"
        if re.search(pattern, sentence):
            found.append(table[phrase])
            sentence = re.sub(pattern, " ", sentence)
    return found


@dataclass
class ParsedCaption:
    facts: set[tuple]
    relations: list[tuple[str, str, str]]  # (object name, relation, object name)
    unparsed: list[str]


def parse(text: str) -> ParsedCaption:
    """Read facts out of a caption in the `describe` grammar; sentences it cannot read are listed."""
    facts, relations, unparsed = set(), [], []
    for raw in re.split(r"(?<=[.!?])\s+", text.strip()):
        sentence = raw.strip().rstrip(".").lower().replace(",", "")
        if not sentence:
            continue
        relation = _RELATION.match(sentence)
        if relation:
            c1, s1, rel, c2, s2 = relation.groups()
            relations.append((f"{c1} {s1}", rel, f"{c2} {s2}"))
            continue
        if "background" in sentence:
            count = _find(sentence, _NUMBER)
            colours, styles = _find(sentence, {b: b for b in BACKGROUNDS}), _find(sentence, _STYLE)
            if len(count) == 1 and len(colours) == 1 and len(styles) == 1:
                facts |= {("count", count[0]), ("background", colours[0]), ("style", styles[0])}
            else:
                unparsed.append(raw)
            continue
        line = _LINE.search(sentence)
        if line and not _find(sentence, _CELL):
            kind = line.group(1)
            names = ROWS if kind == "row" else COLUMNS
            index = [i for i, name in enumerate(names) if re.search(rf"\b{name} {kind}\b", sentence)]
            count = 0 if ("empty" in sentence or sentence.startswith("nothing")) else _find(sentence, _NUMBER)
            if len(index) == 1 and (count == 0 or len(count) == 1):
                facts.add((kind, index[0], count if count == 0 else count[0]))
            else:
                unparsed.append(raw)
            continue
        cells, shapes = _find(sentence, _CELL), _find(sentence, {s: s for s in SHAPES})
        colours, sizes, textures = (_find(sentence, {c: c for c in COLOURS}), _find(sentence, _SIZE),
                                    _find(sentence, _TEXTURE))
        if all(len(x) == 1 for x in (cells, shapes, colours, sizes, textures)):
            cell = cells[0]
            facts |= {("shape", cell, shapes[0]), ("colour", cell, colours[0]), ("size", cell, sizes[0]),
                      ("texture", cell, textures[0])}
        elif not any((cells, shapes, colours, sizes, textures)):
            continue  # a closing line: no facts
        else:
            unparsed.append(raw)
    return ParsedCaption(facts, relations, unparsed)


def relation_holds(scene: Scene, relation: tuple[str, str, str]) -> bool:
    by_name = {o.name: o for o in scene.objects}
    a, rel, b = relation
    if a not in by_name or b not in by_name:
        return False
    (ra, ca), (rb, cb) = by_name[a].cell, by_name[b].cell
    return {"to the left of": ca < cb, "to the right of": ca > cb, "above": ra < rb, "below": ra > rb}[rel]


def fact_scores(text: str, scene: Scene) -> tuple[float, float, float]:
    """(precision, recall, relation accuracy) of a caption's facts against the scene."""
    parsed, truth = parse(text), scene_facts(scene)
    hits = len(parsed.facts & truth)
    precision = hits / len(parsed.facts) if parsed.facts else 0.0
    relations = sum(relation_holds(scene, r) for r in parsed.relations)
    return precision, hits / len(truth), relations / len(parsed.relations) if parsed.relations else 1.0
