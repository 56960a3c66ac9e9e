"""Draft trees: the spec a user picks, the per-row tree a drafter builds, and the tensors verification needs.

Node 0 of every tree is the root: the pending token the target has chosen but not yet processed. Draft
nodes follow in topological order (a parent always has a smaller index than its children), so masks,
paths and child tables are built level by level with tensor ops, never by a loop over nodes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import torch
from torch import Tensor

from specmm.core.sampling import Generators, SamplingConfig, process_logits, sample


@dataclass(frozen=True)
class TreeSpec:
    """Shape of the draft each round: a chain, a fixed (Medusa/EAGLE) tree, or an EAGLE-2 dynamic tree."""

    kind: str
    depth: int
    top_k: int = 1
    total_tokens: int = 0
    choices: tuple[tuple[int, ...], ...] = ()
    _layout: tuple[list[int], list[int], list[int]] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        # computed here, not cached on first use: a compiled round traces `static_layout`, and dynamo cannot take
        # the lock of a cached_property first computed inside a graph
        object.__setattr__(self, "_layout", _static_layout(self.choices))

    @classmethod
    def chain(cls, k: int) -> TreeSpec:
        """`k` draft tokens in a line (sampled drafts when sampling, argmax drafts when greedy)."""
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"TreeSpec.chain: k must be an integer >= 1, got {k!r}")
        return cls(kind="chain", depth=k, total_tokens=k + 1)

    @classmethod
    def static(cls, choices: Sequence[Sequence[int]]) -> TreeSpec:
        """A fixed tree from paths of sibling ranks, e.g. `[[0], [1], [0, 0]]` (Medusa/EAGLE choice lists)."""
        paths = sorted({tuple(int(r) for r in c) for c in choices}, key=lambda p: (len(p), p))
        if not paths:
            raise ValueError("TreeSpec.static: choices must hold at least one path")
        known = set(paths)
        for p in paths:
            if len(p) == 0 or min(p) < 0:
                raise ValueError(f"TreeSpec.static: choice {list(p)} must be a non-empty list of ranks >= 0")
            if len(p) > 1 and p[:-1] not in known:
                raise ValueError(f"TreeSpec.static: choice {list(p)} needs its parent {list(p[:-1])} in choices")
        top_k = max(p[-1] for p in paths) + 1
        return cls(kind="static", depth=max(map(len, paths)), top_k=top_k, total_tokens=len(paths) + 1,
                   choices=tuple(paths))

    @classmethod
    def dynamic(cls, depth: int = 6, top_k: int = 8, total_tokens: int = 60) -> TreeSpec:
        """EAGLE-2: expand the top-k frontier by cumulative log-probability, keep the best `total_tokens` nodes
        (root included)."""
        for name, v in (("depth", depth), ("top_k", top_k), ("total_tokens", total_tokens)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"TreeSpec.dynamic: {name} must be an integer >= 1, got {v!r}")
        pool = top_k + (depth - 1) * top_k * top_k
        if not 2 <= total_tokens <= pool + 1:
            raise ValueError(f"TreeSpec.dynamic: total_tokens must be in [2, {pool + 1}] for depth={depth}, "
                             f"top_k={top_k}, got {total_tokens}")
        return cls(kind="dynamic", depth=depth, top_k=top_k, total_tokens=total_tokens)

    @property
    def num_nodes(self) -> int:
        """Nodes per tree, root included."""
        return self.total_tokens

    @property
    def max_children(self) -> int:
        return 1 if self.kind == "chain" else self.top_k

    @property
    def static_layout(self) -> tuple[list[int], list[int], list[int]]:
        """(parent, sibling rank, depth) per node of a static tree, root first."""
        return self._layout


def _static_layout(choices: tuple[tuple[int, ...], ...]) -> tuple[list[int], list[int], list[int]]:
    """(parent, sibling rank, depth) per node of the static tree of `choices` (sorted paths), root first."""
    index = {(): 0}
    parents, ranks, depths = [-1], [0], [0]
    for i, path in enumerate(choices, start=1):
        index[path] = i
        parents.append(index[path[:-1]])
        ranks.append(path[-1])
        depths.append(len(path))
    return parents, ranks, depths


@dataclass
class DraftTree:
    """One draft tree per row. Padding nodes (`valid` False) are ignored by verification."""

    tokens: Tensor  # [B, T] node 0 is the root
    parents: Tensor  # [B, T] parent node index, -1 at the root
    depth: Tensor  # [B, T]
    valid: Tensor  # [B, T] bool
    max_depth: int
    max_children: int
    draft_probs: Tensor | None = None  # [B, T, V] distribution each node was sampled from; None = point masses
    node_slots: Tensor | None = field(default=None, repr=False)  # [B, T] drafter round slot per node, -1 if none

    @property
    def num_nodes(self) -> int:
        return self.tokens.shape[1]

    @cached_property
    def ancestors(self) -> Tensor:
        """[B, T, T] bool: entry (i, j) is True when node j is node i or one of its ancestors."""
        return ancestor_mask(self.parents, self.depth, self.max_depth)

    @cached_property
    def children(self) -> Tensor:
        """[B, T, C] child node indices in sibling order, -1 where a node has fewer than C children."""
        return children_table(self.parents, self.valid, self.max_children)

    def path_to(self, node: Tensor) -> Tensor:
        """[B] node -> [B, max_depth + 1] the node's ancestor at each depth, root first (0 past its depth)."""
        rows = self.ancestors[torch.arange(node.shape[0], device=node.device), node]  # [B, T]
        levels = torch.arange(self.max_depth + 1, device=node.device)
        at_level = rows[:, None, :] & (self.depth[:, None, :] == levels[None, :, None])  # [B, D+1, T]
        # at most one ancestor per level: the sum of indices picks it (0 past the node's depth); no argmax over
        # bools, which inductor's CPU code gets wrong for all-False rows
        nodes = torch.arange(self.tokens.shape[1], device=node.device)
        return (at_level.long() * nodes).sum(-1)


def limit_depth(tree: DraftTree, max_depth: Tensor) -> DraftTree:
    """Row b keeps only nodes at depth <= max_depth[b] ([B]) whose ancestors are all valid; the others become
    invalid padding at depth 0, so verification runs them at the root's position (never past a position
    limit or a row's token budget) and ignores them."""
    known = tree.__dict__.get("ancestors")
    valid, depth, ancestors = limited_tables(tree.parents, tree.depth, tree.valid, max_depth, tree.max_depth, known)
    limited = dataclasses.replace(tree, valid=valid, depth=depth)
    limited.__dict__["ancestors"] = ancestors
    return limited


def limited_tables(parents: Tensor, depth: Tensor, valid: Tensor, max_depth: Tensor, tree_depth: int,
                   ancestors: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """`limit_depth`'s tensors: the kept nodes' valid [B, T] and depth [B, T], and the cut tree's ancestor
    table [B, T, T] (kept nodes keep their ancestors; a node cut to depth 0 is its own only ancestor)."""
    if ancestors is None:
        ancestors = ancestor_mask(parents, depth, tree_depth)
    valid = valid & (depth <= max_depth[:, None])
    valid = ~((~valid)[:, None, :] & ancestors).any(-1)  # [B, T] every ancestor-or-self kept
    eye = torch.eye(valid.shape[1], dtype=torch.bool, device=valid.device)
    return valid, torch.where(valid, depth, 0), torch.where(valid[:, :, None], ancestors, eye)


GATHER_MAX_DEPTH = 4  # compiled trees up to this depth read parents' rows by a gather: cheap to compile at this
# depth, and 1-4 % faster warm than the one-hot product on a chain of 4 (benchmarks/ancestor_mask_ab.py)


def ancestor_mask(parents: Tensor, depth: Tensor, max_depth: int) -> Tensor:
    """[B, T] parents/depth -> [B, T, T] ancestor-or-self mask, one tensor op per level."""
    batch, nodes = parents.shape
    eye = torch.eye(nodes, dtype=torch.bool, device=parents.device).expand(batch, nodes, nodes)
    parent_rows = parents.clamp_min(0)[:, :, None].expand(batch, nodes, nodes)
    if torch.compiler.is_compiling() and max_depth > GATHER_MAX_DEPTH:
        # Compiled, inductor inlines each level into the next: a level reads the one before twice (its own row and,
        # through the gather, its parent's), so level l reads level 0 2^l times. A chain's parents are `arange - 1`,
        # which inductor folds into those reads' indices, nesting one Max(0, i - 1) per level: simplifying them took
        # 6 of the 7 minutes a depth-8 prompt-lookup round compiled in. Here each level reads its parents' rows by a
        # one-hot matrix product, which inductor runs as its own kernel: one read of the level before.
        pick = (parent_rows == torch.arange(nodes, device=parents.device)).float()  # [B, T, T] one-hot rows
        own = eye.float()  # [B, T, T] 0/1
        rows = own
        for level in range(1, max_depth + 1):
            inherited = torch.maximum(torch.bmm(pick, rows), own)
            rows = torch.where((depth == level)[:, :, None], inherited, rows)
        return rows > 0
    mask = eye.clone()
    for level in range(1, max_depth + 1):
        inherited = mask.gather(1, parent_rows) | eye
        mask = torch.where((depth == level)[:, :, None], inherited, mask)
    return mask


def children_table(parents: Tensor, valid: Tensor, max_children: int) -> Tensor:
    """[B, T] parents -> [B, T, C] children in index order; extra children beyond C are dropped."""
    batch, nodes = parents.shape
    idx = torch.arange(nodes, device=parents.device)
    earlier_sibling = (parents[:, :, None] == parents[:, None, :]) & valid[:, None, :] & (idx[None, :] < idx[:, None])
    rank = earlier_sibling.sum(-1)  # [B, T]
    placed = valid & (parents >= 0) & (rank < max_children)
    row = torch.where(placed, parents, nodes)  # dump row T for roots and padding
    col = torch.where(placed, rank, max_children)  # dump column C
    table = torch.full((batch, (nodes + 1) * (max_children + 1)), -1, dtype=torch.long, device=parents.device)
    table.scatter_(1, row * (max_children + 1) + col, idx.expand(batch, nodes).contiguous())
    return table.view(batch, nodes + 1, max_children + 1)[:, :nodes, :max_children]


# --------------------------------------------------------------------------------------------- builders

Expand = Callable[[Tensor, Tensor], Tensor]
"""`expand(tokens [B, n], parent_slots [B, n]) -> logits [B, n, V]`: run the drafter on n new nodes.

Every call appends n drafter round slots (numbered from 0 within the round); `parent_slots` names the
slot of each node's parent, or -1 when the parent is the root (whose logits the builder already has).
"""

ProcessDrafts = Callable[[Tensor, Tensor], Tensor]
"""`process(logits [B, n, V], paths [B, n, d]) -> [B, n, V]`: the target's logits processors applied to draft logits
after n nodes, each reached from the root by the d tokens of its path."""


def grow_tree(spec: TreeSpec, roots: Tensor, root_logits: Tensor, expand: Expand,
              sampling: SamplingConfig, generators: Generators = None,
              process: ProcessDrafts | None = None) -> DraftTree:
    """Build a [B] batch of draft trees under `roots` from a drafter step function. `process`: the target's logits
    processors, applied to the draft logits after each node before tokens are picked."""
    if spec.kind == "chain":
        return _grow_chain(spec, roots, root_logits, expand, sampling, generators, process)
    if spec.kind == "static":
        return _grow_static(spec, roots, root_logits, expand, process)
    return _grow_dynamic(spec, roots, root_logits, expand, process)


def _processed_root(root_logits: Tensor, process: ProcessDrafts | None) -> Tensor:
    """root_logits [B, V], processed after the root alone (a path of no tokens)."""
    if process is None:
        return root_logits
    no_path = torch.zeros(root_logits.shape[0], 1, 0, dtype=torch.long, device=root_logits.device)
    return process(root_logits[:, None], no_path)[:, 0]


def _grow_chain(spec, roots, root_logits, expand, sampling, generators, process=None) -> DraftTree:
    """Sampled drafts (with their distributions) when sampling, argmax drafts when greedy."""
    batch, k, device = roots.shape[0], spec.depth, roots.device
    tokens, probs = [roots], []
    logits = _processed_root(root_logits, process)
    for level in range(1, k + 1):
        if sampling.greedy:
            token = logits.argmax(-1)
        else:
            draft_probs = process_logits(logits, sampling)  # [B, V]
            token = sample(draft_probs, generators)
            probs.append(draft_probs)
        tokens.append(token)
        if level < k:
            parent_slot = torch.full((batch, 1), level - 2, device=device)
            logits = expand(token[:, None], parent_slot)  # [B, 1, V]
            logits = (logits if process is None else process(logits, torch.stack(tokens[1:], 1)[:, None]))[:, 0]
    nodes = torch.arange(k + 1, device=device).expand(batch, k + 1)
    slots = torch.where((nodes >= 1) & (nodes < k), nodes - 1, -1)
    draft_probs = None
    if probs:
        draft_probs = torch.stack([torch.zeros_like(probs[0])] + probs, dim=1)  # [B, k+1, V]
    return DraftTree(tokens=torch.stack(tokens, 1), parents=nodes - 1, depth=nodes.clone(),
                     valid=torch.ones_like(nodes, dtype=torch.bool), max_depth=k, max_children=1,
                     draft_probs=draft_probs, node_slots=slots)


def _grow_static(spec, roots, root_logits, expand, process=None) -> DraftTree:
    """Node i takes the rank-th best token of its parent; only nodes with children are run."""
    parents, ranks, depths = spec.static_layout
    batch, nodes, device = roots.shape[0], len(parents), roots.device
    has_children = [False] * nodes
    for p in parents[1:]:
        has_children[p] = True
    candidates = torch.zeros(batch, nodes, spec.top_k, dtype=torch.long, device=device)  # [B, T, K]
    candidates[:, 0] = _processed_root(root_logits, process).topk(spec.top_k, dim=-1).indices
    tokens = torch.zeros(batch, nodes, dtype=torch.long, device=device)
    tokens[:, 0] = roots
    slots = [-1] * nodes
    next_slot = 0
    for level in range(1, spec.depth + 1):
        level_nodes = [i for i in range(nodes) if depths[i] == level]
        node_idx = torch.tensor(level_nodes, device=device)
        parent_idx = torch.tensor([parents[i] for i in level_nodes], device=device)
        rank_idx = torch.tensor([ranks[i] for i in level_nodes], device=device)
        tokens[:, node_idx] = candidates[:, parent_idx, rank_idx]
        run = [i for i in level_nodes if has_children[i]]
        if run:
            parent_slots = torch.tensor([slots[parents[i]] for i in run], device=device).expand(batch, -1)
            logits = expand(tokens[:, run], parent_slots)  # [B, n, V]
            if process is not None:
                path_idx = torch.tensor([_path_below_root(parents, i) for i in run], device=device)  # [n, level]
                logits = process(logits, tokens[:, path_idx])
            candidates[:, run] = logits.topk(spec.top_k, dim=-1).indices
            for i in run:
                slots[i] = next_slot
                next_slot += 1
    as_tensor = lambda xs: torch.tensor(xs, device=device).expand(batch, nodes).contiguous()  # noqa: E731
    return DraftTree(tokens=tokens, parents=as_tensor(parents), depth=as_tensor(depths),
                     valid=torch.ones(batch, nodes, dtype=torch.bool, device=device), max_depth=spec.depth,
                     max_children=spec.top_k, node_slots=as_tensor(slots))


def _path_below_root(parents: list[int], node: int) -> list[int]:
    """The nodes from depth 1 down to `node` of a static layout (`parents[0]` is the root's, -1)."""
    path = []
    while node > 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def _grow_dynamic(spec, roots, root_logits, expand, process=None) -> DraftTree:
    """EAGLE-2: a top-k frontier per level scored by cumulative log-prob, then the global best nodes.

    The tensor work between drafter runs is three pure steps (`dynamic_first`, `dynamic_level`, `dynamic_pick`)."""
    k = spec.top_k
    level_state, pool = dynamic_first(_processed_root(root_logits, process), k)
    for level in range(2, spec.depth + 1):
        logits = expand(level_state[1], level_state[3])  # [B, K, V] children of the frontier
        if process is not None:
            logits = process(logits, frontier_paths(level_state, pool, level - 1))
        level_state, pool = dynamic_level(logits, level_state, pool, level, k)
    tokens, parents, depth, node_slots, ancestors = dynamic_pick(roots, pool, spec.total_tokens, spec.depth)
    tree = DraftTree(tokens=tokens, parents=parents, depth=depth, valid=torch.ones_like(tokens, dtype=torch.bool),
                     max_depth=spec.depth, max_children=k, node_slots=node_slots)
    tree.__dict__["ancestors"] = ancestors
    return tree


Frontier = tuple[Tensor, Tensor, Tensor, Tensor]
"""(scores, tokens, pool index, parent drafter slot), each [B, K]: the nodes the next drafter run expands."""
Pool = tuple[Tensor, Tensor, Tensor, Tensor, Tensor]
"""(tokens, cumulative scores, parent pool index (-1 = root), depth, drafter slot (-1 = not run)), each [B, N]:
every candidate node so far, level by level."""


def dynamic_first(root_logits: Tensor, k: int) -> tuple[Frontier, Pool]:
    """Depth 1: the root's top-k children (root_logits [B, V]) are the pool and the first frontier."""
    scores, tokens = root_logits.float().log_softmax(-1).topk(k, dim=-1)  # [B, K]
    none = torch.full_like(tokens, -1)
    frontier = torch.arange(k, device=tokens.device).expand_as(tokens)
    return (scores, tokens, frontier, none), (tokens, scores, none, torch.ones_like(tokens), none)


def frontier_paths(frontier: Frontier, pool: Pool, depth: int) -> Tensor:
    """[B, K, depth] tokens below the root down to each frontier node (at `depth`), read up the pool's parents."""
    tokens, _, parent, _, _ = pool
    index, path = frontier[2], []
    for _ in range(depth):
        path.append(tokens.gather(1, index))
        index = parent.gather(1, index).clamp_min(0)  # the root (-1) ends the walk; clamped, never read
    return torch.stack(path[::-1], 2)


def dynamic_level(logits: Tensor, frontier: Frontier, pool: Pool, level: int, k: int) -> tuple[Frontier, Pool]:
    """Add the frontier's top-k children (logits [B, K, V], run in drafter slots numbered on from the earlier
    levels') to the pool at `level`; the k best by cumulative score are the next frontier."""
    scores, _, where, _ = frontier
    tokens, all_scores, parent, depth, slot = pool
    first_slot = (level - 2) * k  # one drafter run of k slots per level before this one
    ran = torch.arange(first_slot, first_slot + k, device=logits.device).expand_as(where)  # [B, K]
    slot = slot.scatter(1, where, ran)
    child_scores, child_tokens = logits.float().log_softmax(-1).topk(k, dim=-1)  # [B, K, K]
    cumulative = (scores[:, :, None] + child_scores).flatten(1)  # [B, K*K]
    child_tokens = child_tokens.flatten(1)
    offset = tokens.shape[1]
    pool = (torch.cat([tokens, child_tokens], 1), torch.cat([all_scores, cumulative], 1),
            torch.cat([parent, where.repeat_interleave(k, dim=1)], 1),
            torch.cat([depth, torch.full_like(child_tokens, level)], 1),
            torch.cat([slot, torch.full_like(child_tokens, -1)], 1))
    next_scores, best = cumulative.topk(k, dim=-1)
    return (next_scores, child_tokens.gather(1, best), offset + best, ran.gather(1, best // k)), pool


def dynamic_pick(roots: Tensor, pool: Pool, total_tokens: int, max_depth: int
                 ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The tree of roots [B] and the pool's `total_tokens - 1` best nodes, in pool (topological) order:
    tokens, parents, depth, drafter slots [B, T] and the ancestor table [B, T, T]."""
    tokens, scores, parent, depth, slot = pool
    batch, size = tokens.shape
    # stable sort keeps pool order (hence parents before children) among equal scores
    keep = scores.sort(dim=-1, descending=True, stable=True).indices[:, : total_tokens - 1]
    keep = keep.sort(dim=-1).values  # [B, N] pool indices in topological order
    numbers = torch.arange(1, keep.shape[1] + 1, device=keep.device).expand_as(keep).contiguous()
    tree_index = torch.full((batch, size), -1, device=keep.device).scatter(1, keep, numbers)
    parent_pool = parent.gather(1, keep)
    parents = torch.where(parent_pool < 0, 0, tree_index.gather(1, parent_pool.clamp_min(0)))
    zero = torch.zeros(batch, 1, dtype=torch.long, device=roots.device)
    parents = torch.cat([zero - 1, parents], 1)
    depth = torch.cat([zero, depth.gather(1, keep)], 1)
    return (torch.cat([roots[:, None], tokens.gather(1, keep)], 1), parents, depth,
            torch.cat([zero - 1, slot.gather(1, keep)], 1), ancestor_mask(parents, depth, max_depth))
