"""Static draft trees for image drafters: LANTERN++'s 57-node shape (5/13/16/14/9 nodes per depth)."""

from __future__ import annotations

from collections.abc import Sequence

from specmm.core.tree import TreeSpec

LANTERN_PP_57_LEVELS = (5, 13, 16, 14, 9)


def extend_tree(level_sizes: Sequence[int], top_k: int = 10) -> list[list[int]]:
    """Choice paths with `level_sizes[d]` nodes at depth d+1: each level gives rank 0 to every parent (best
    first), then rank 1, ... until the level is full (a 'naive extend' of the best paths)."""
    paths: list[list[int]] = [[]]
    choices: list[list[int]] = []
    for size in level_sizes:
        level: list[list[int]] = []
        for rank in range(top_k):
            for parent in paths:
                if len(level) < size:
                    level.append([*parent, rank])
        if len(level) < size:
            raise ValueError(f"level_sizes: {size} nodes do not fit under {len(paths)} parents with top_k={top_k}")
        choices += level
        paths = level
    return choices


def lantern_pp_tree() -> TreeSpec:
    """LANTERN++'s default static tree size and depth profile (57 draft nodes, depth 5)."""
    return TreeSpec.static(extend_tree(LANTERN_PP_57_LEVELS))
