"""Static draft trees for image drafters: LANTERN++'s default `naive_extend_57` (57 nodes, depth 5)."""

from __future__ import annotations

from specmm.core.tree import TreeSpec

# LANTERN++'s default static tree for LlamaGen / Anole, as choice paths (child ranks from the root), one
# row per depth: 5 / 13 / 16 / 14 / 9 nodes. The shape of the paper's tree, restated as data.
NAIVE_EXTEND_57: tuple[tuple[int, ...], ...] = (
    (0,), (1,), (2,), (3,), (4,),
    (0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (2, 2), (3, 0), (3, 1), (4, 0),
    (0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 0, 3), (0, 1, 0), (0, 1, 1), (0, 1, 2), (0, 2, 0), (0, 2, 1), (0, 2, 2),
    (0, 3, 0), (0, 3, 1), (1, 0, 0), (1, 0, 1), (1, 1, 0), (2, 0, 0),
    (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 0, 2), (0, 0, 0, 3), (0, 0, 1, 0), (0, 0, 1, 1), (0, 0, 1, 2),
    (0, 0, 2, 0), (0, 0, 2, 1), (0, 0, 3, 0), (0, 1, 0, 0), (0, 1, 0, 1), (0, 1, 1, 0), (0, 2, 0, 0),
    (0, 0, 0, 0, 0), (0, 0, 0, 0, 1), (0, 0, 0, 0, 2), (0, 0, 0, 1, 0), (0, 0, 0, 1, 1), (0, 0, 1, 0, 0),
    (0, 0, 1, 0, 1), (0, 0, 1, 1, 0), (0, 0, 2, 0, 0),
)


def lantern_pp_tree() -> TreeSpec:
    """LANTERN++'s default static tree (`naive_extend_57`: 57 draft nodes, depth 5)."""
    return TreeSpec.static(NAIVE_EXTEND_57)
