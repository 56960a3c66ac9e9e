"""Drafters: the protocol the engine drives, a small-model drafter and an n-gram prompt-lookup drafter.

Each round a drafter gets the root tokens (the target's latest tokens, not yet verified by anything),
builds a `DraftTree` under them, and after verification learns which path was accepted and the target's
next token. `EagleDrafter` (feature-level head) lives in `specmm.core.eagle`.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from specmm.core.acceptance import AcceptResult
from specmm.core.compiled import StaticPlan, compiles
from specmm.core.resident import owner_of, resident
from specmm.core.inplace import write_columns_
from specmm.core.sampling import Generators, SamplingConfig
from specmm.core.target import (
    ModelRunner,
    PrefillOutput,
    RunnerOwner,
    check_runnable,
    final_norm,
    model_device,
    output_vocab_size,
)
from specmm.core.tree import DraftTree, ProcessDrafts, TreeSpec, grow_tree


@runtime_checkable
class Drafter(Protocol):
    vocab_size: int | None  # None: proposes tokens of the target's own vocabulary (e.g. copied from context)
    device: torch.device | None
    needs: frozenset[str]  # what it reads from the target: FEATURES, INPUTS_EMBEDS, ...
    draft_forwards: int  # batched drafter forwards so far

    def check_spec(self, spec: TreeSpec) -> None:
        """Raise ValueError when this drafter cannot build `spec` trees."""
        ...

    def start(self, input_ids: Tensor, attention_mask: Tensor, prefill: PrefillOutput) -> None:
        """Begin a generation on a left-padded prompt [B, L]; its last column holds the first roots.

        prefill: what the target saw of the prompt minus its last token (features etc., as `needs` asks).
        """
        ...

    def draft(self, roots: Tensor, spec: TreeSpec, sampling: SamplingConfig, generators: Generators) -> DraftTree:
        """A [B] batch of trees under `roots`. A drafter whose class sets `processes_drafts = True` also takes
        `process` (`tree.ProcessDrafts`): the target's generation_config processors, to apply to its draft logits
        before it picks tokens; the engine passes it when the target has processors."""
        ...

    def update(self, tree: DraftTree, result: AcceptResult, path_features: Tensor | None) -> None:
        """Learn the outcome: the accepted path, the next root (`result.next_token`) and, when FEATURES are
        needed, the target features [B, D+1, H] at the path's nodes."""
        ...

    def select_rows(self, rows: Tensor) -> None:
        ...


def accepted_tokens(tree: DraftTree, result: AcceptResult) -> Tensor:
    """[B, D+1] the round's new tokens: accepted drafts, then the target's next token at index num_accepted."""
    return path_tokens(tree.tokens, result.path, result.num_accepted, result.next_token)


def path_tokens(tokens: Tensor, path: Tensor, num_accepted: Tensor, next_token: Tensor) -> Tensor:
    """`accepted_tokens` on tensors: tokens [B, T], path [B, D+1], num_accepted and next_token [B] -> [B, D+1]."""
    drafts = tokens.gather(1, path[:, 1:])  # [B, D]
    padded = torch.cat([drafts, drafts.new_zeros(drafts.shape[0], 1)], 1)
    return padded.scatter(1, num_accepted[:, None], next_token[:, None])


class RoundSlots:
    """What a drafter ran this round, slot by slot: each slot's tree depth and, optionally, its hidden state."""

    def __init__(self, root_hidden: Tensor | None = None):
        self.root_hidden = root_hidden  # [B, H] hidden state at the root (parent of depth-1 nodes)
        self._depth: list[Tensor] = []  # [B, n] per block of slots
        self._hidden: list[Tensor] = []  # [B, n, H] per block of slots

    def child_depth(self, parent_slots: Tensor) -> Tensor:
        """[B, n] parent slots (-1 = root) -> depth of the children."""
        if not self._depth:
            return torch.ones_like(parent_slots)
        known = torch.cat(self._depth, 1).gather(1, parent_slots.clamp_min(0))
        return torch.where(parent_slots >= 0, known, 0) + 1

    def parent_hidden(self, parent_slots: Tensor) -> Tensor:
        """[B, n] parent slots -> [B, n, H] hidden states of the parents (the root's for -1)."""
        root = self.root_hidden[:, None, :].expand(*parent_slots.shape, -1)
        if not self._hidden:
            return root
        known = torch.cat(self._hidden, 1)
        index = parent_slots.clamp_min(0)[:, :, None].expand(*parent_slots.shape, known.shape[-1])
        return torch.where((parent_slots >= 0)[:, :, None], known.gather(1, index), root)

    def add(self, depth: Tensor, hidden: Tensor | None = None) -> None:
        self._depth.append(depth)
        if hidden is not None:
            self._hidden.append(hidden)


def shift_left(values: Tensor, shift: Tensor, count: Tensor) -> tuple[Tensor, Tensor]:
    """Row b of [B, W, ...] -> its entries [shift[b], shift[b] + count[b]) moved to the front, and a [B, W]
    validity mask."""
    width = values.shape[1]
    offsets = torch.arange(width, device=values.device)
    index = (shift[:, None] + offsets).clamp(max=width - 1)  # [B, W]
    gathered = values.gather(1, index.view(*index.shape, *([1] * (values.dim() - 2))).expand_as(values))
    return gathered, offsets[None, :] < count[:, None]


def drafter_update(node_slots: Tensor, tokens: Tensor, path: Tensor, num_accepted: Tensor, next_token: Tensor
                   ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """What a cached model drafter keeps of a round: the round slots [B, D] whose first reused[b] entries it
    already ran on row b's accepted path, reused [B], and the tokens to feed next (pending [B, D+1], left-aligned,
    with their valid mask): the rest of the accepted path, then the target's next token.

    node_slots, tokens: [B, T] of the verified tree; path: [B, D+1]; num_accepted, next_token: [B]."""
    path_slots = node_slots.gather(1, path[:, 1:])  # [B, D] drafter slot of each accepted draft
    steps = torch.arange(path_slots.shape[1], device=path.device)
    ran = (path_slots >= 0) & (steps[None, :] < num_accepted[:, None])
    reused = ran.long().cumprod(1).sum(1)  # [B] leading accepted drafts already in the round's slots
    new = path_tokens(tokens, path, num_accepted, next_token)  # [B, D+1]
    pending, valid = shift_left(new, reused, num_accepted - reused + 1)
    return path_slots.clamp_min(0), reused, pending, valid


class CountsForwards:
    """`draft_forwards` counted in a device tensor: a compiled round adds to it with no guard on its value (a
    Python int would recompile the round at every count) and no host sync; reading it syncs once."""

    device: torch.device | None
    _forward_count: Tensor | None = None  # [] long on the drafter's device

    @property
    def draft_forwards(self) -> int:
        count = self._forward_count
        return 0 if count is None or count.is_meta else int(count)

    @draft_forwards.setter
    def draft_forwards(self, value: int) -> None:
        count = torch.tensor(value, dtype=torch.long, device=self.device)
        plan = getattr(self, "static_plan", None)  # under CUDA graphs the counter keeps its address
        self._forward_count = resident(owner_of(self), "draft_forwards", count, None if plan is None else plan.mode)

    def count_forwards(self, n: int = 1) -> None:
        self._forward_count.add_(n)


class ModelDrafter(CountsForwards, RunnerOwner):
    """A smaller HF causal LM with the target's vocabulary: its own cache, chains or top-k trees.

    Tree nodes it ran and the target accepted stay in its cache; the rest of the accepted path and the
    target's next token are fed at the start of the next round. `features=True` also captures the draft
    model's own last-layer features (after its final norm) in every forward, as `open_chain` returns them;
    `close` then removes the hook.
    """

    needs: frozenset[str] = frozenset()
    processes_drafts = True  # draft() takes the target's logits processors (`process`)
    uniform_first_round = True  # compiled mode: the state `start` leaves has the later rounds' shapes

    def __init__(self, model: nn.Module, features: bool = False):
        check_runnable(model, "drafter")
        if features and final_norm(model) is None:
            raise ValueError(f"draft: cannot find the final norm of {type(model).__name__} to read features")
        self.model = model
        self.features = features
        self.vocab_size = output_vocab_size(model)
        self.device = model_device(model)
        self.draft_forwards = 0
        self.runner: ModelRunner | None = None
        self.static_plan = None  # set by the engine in compiled mode
        self.position_cap: int | None = None  # set by the engine: positions clamped below it (`shared_rope_threshold`)

    def check_spec(self, spec: TreeSpec) -> None:
        return None

    def close(self) -> None:
        """Remove the feature hook from the draft model (when `features=True`) and drop the cache."""
        if self.runner is not None:
            self.runner.close()
            self.runner = None

    @torch.no_grad()
    def start(self, input_ids: Tensor, attention_mask: Tensor, prefill: PrefillOutput) -> None:
        self.close()
        capture = final_norm(self.model) if self.features else None
        self.runner = ModelRunner(self.model, input_ids.shape[0], capture=capture, static=self.static_plan,
                                  row_slots=self.row_slots)
        if self.position_cap is not None:
            self.runner.position_limit = min(self.runner.position_limit or self.position_cap, self.position_cap)
        self.draft_forwards = 0
        if input_ids.shape[1] > 1:
            self.runner.extend(attention_mask[:, :-1].bool(), input_ids=input_ids[:, :-1], logits_to_keep=1)
            self.count_forwards()
        self.pending = input_ids[:, -1:]  # [B, P] tokens to feed next, left-aligned, ending with the root
        self.pending_valid = torch.ones_like(self.pending, dtype=torch.bool)
        if compiles(self.static_plan):  # the later rounds' width, so the first round runs their graph
            spare = self.static_plan.round_tokens - 1
            self.pending = nn.functional.pad(self.pending, (0, spare))
            self.pending_valid = nn.functional.pad(self.pending_valid, (0, spare))

    @torch.no_grad()
    def draft(self, roots: Tensor, spec: TreeSpec, sampling: SamplingConfig, generators: Generators,
              process: ProcessDrafts | None = None) -> DraftTree:
        rows = torch.arange(roots.shape[0], device=roots.device)
        logits = self.runner.extend(self.pending_valid, input_ids=self.pending).logits  # [B, P, V]
        self.count_forwards()
        root_logits = logits[rows, self.pending_valid.sum(1) - 1]  # [B, V]
        root_position = self.runner.cache.lengths - 1  # [B]
        slots = RoundSlots()

        def expand(tokens: Tensor, parent_slots: Tensor) -> Tensor:
            depth = slots.child_depth(parent_slots)  # [B, n]
            slots.add(depth)
            self.count_forwards()
            out = self.runner.forward_children(parent_slots, root_position[:, None] + depth, input_ids=tokens)
            return out.logits

        return grow_tree(spec, roots, root_logits, expand, sampling, generators, process=process)

    def update(self, tree: DraftTree, result: AcceptResult, path_features: Tensor | None) -> None:
        kept, reused, self.pending, self.pending_valid = drafter_update(tree.node_slots, tree.tokens, result.path,
                                                              result.num_accepted, result.next_token)
        self.runner.cache.commit(kept, reused)

    def select_rows(self, rows: Tensor) -> None:
        self.runner.cache.select_rows(rows)
        self.pending, self.pending_valid = self.pending[rows], self.pending_valid[rows]

    def set_pending(self, tokens: Tensor, valid: Tensor) -> None:
        """Replace the tokens fed at the start of the next draft: each row's valid entries of tokens [B, P]
        (valid [B, P] bool, left-aligned, at least one per row), ending with the row's next root; they must
        continue what the cache holds (a caller that ran known tokens with `open_chain` keeps them in step)."""
        self.pending, self.pending_valid = tokens, valid

    def take_rows(self, rows: Tensor) -> ModelDrafter:
        """A drafter over `rows` [b]: their cache (see `RunnerOwner.take_rows`) and a copy of their pending tokens."""
        part = super().take_rows(rows)
        part.pending, part.pending_valid = self.pending[rows], self.pending_valid[rows]
        part.draft_forwards = 0
        return part

    def put_rows(self, rows: Tensor, part: ModelDrafter) -> None:
        """Write `part`'s cache and pending tokens back over `rows` [b]; closes `part`."""
        super().put_rows(rows, part)
        width = max(self.pending.shape[1], part.pending.shape[1])
        pad = lambda t: nn.functional.pad(t, (0, width - t.shape[1]))  # noqa: E731
        self.pending, self.pending_valid = pad(self.pending), pad(self.pending_valid)
        self.pending[rows], self.pending_valid[rows] = pad(part.pending), pad(part.pending_valid)


class PromptLookupDrafter:
    """Copy the continuation of the latest earlier occurrence of the context's last n-gram (n = ngram..1).

    Proposes a chain of min(k, chain length) tokens per row; a continuation that runs into the end of the
    context repeats as an overlapping copy (the text since the match, again); rows with no match propose nothing.
    Drafts are point masses, so verification stays exact under sampling.
    """

    vocab_size = None
    device = None
    needs: frozenset[str] = frozenset()
    static_plan: StaticPlan | None = None  # compiled mode: the history has the plan's width, so rounds trace whole
    uniform_first_round = True  # compiled mode: the state `start` leaves has the later rounds' shapes

    def __init__(self, ngram: int = 3, k: int = 8):
        if isinstance(ngram, bool) or not isinstance(ngram, int) or ngram < 1:
            raise ValueError(f"ngram must be an integer >= 1, got {ngram!r}")
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be an integer >= 1, got {k!r}")
        self.ngram, self.k = ngram, k
        self.draft_forwards = 0

    def check_spec(self, spec: TreeSpec) -> None:
        if spec.kind != "chain":
            raise ValueError(f"tree: PromptLookupDrafter proposes chains only, got a {spec.kind} tree")

    def start(self, input_ids: Tensor, attention_mask: Tensor, prefill: PrefillOutput) -> None:
        valid = attention_mask.bool()
        order = torch.sort((~valid).to(torch.uint8), dim=1, stable=True).indices
        self.history = input_ids.long().gather(1, order)  # [B, L] real tokens left-aligned, ending with the root
        self.lengths = valid.sum(1)  # [B]
        if self.static_plan is not None:  # [B, max_len]: room for every token the generation can keep
            spare = self.static_plan.max_len - self.history.shape[1]
            history = torch.nn.functional.pad(self.history, (0, max(spare, 0)))
            self.history = resident(owner_of(self), "history", history, self.static_plan.mode)  # written in place

    def draft(self, roots: Tensor, spec: TreeSpec, sampling: SamplingConfig, generators: Generators) -> DraftTree:
        k = min(self.k, spec.depth)
        batch, width = self.history.shape
        device = roots.device
        start = torch.full((batch,), -1, device=device)  # [B] index where the copied continuation starts
        for n in range(min(self.ngram, width - 1), 0, -1):
            windows = self.history.unfold(1, n, 1)  # [B, W - n + 1, n]
            tail = (self.lengths[:, None] - n + torch.arange(n, device=device)).clamp_min(0)
            suffix = self.history.gather(1, tail)  # [B, n]
            begins = torch.arange(windows.shape[1], device=device)
            match = (windows == suffix[:, None, :]).all(-1) & (begins[None, :] + n < self.lengths[:, None])
            found = torch.where(match, begins + n, -1).max(1).values
            start = torch.where((start < 0) & (self.lengths > n), found, start)
        # a continuation that reaches the context's end goes on as an overlapping copy (LZ77): the period
        # lengths - start repeats, so a repeating pattern is drafted k deep, not cut at the end of the context
        period = (self.lengths - start).clamp_min(1)  # [B]
        count = torch.where(start >= 0, k, 0)  # [B]
        steps = torch.arange(k, device=device)
        index = (start.clamp_min(0)[:, None] + steps[None, :] % period[:, None]).clamp(max=width - 1)
        drafts = self.history.gather(1, index)  # [B, k]
        nodes = torch.arange(k + 1, device=device).expand(batch, k + 1)
        return DraftTree(tokens=torch.cat([roots[:, None], drafts], 1), parents=nodes - 1, depth=nodes.clone(),
                         valid=nodes <= count[:, None], max_depth=k, max_children=1)

    def update(self, tree: DraftTree, result: AcceptResult, path_features: Tensor | None) -> None:
        new = accepted_tokens(tree, result)  # [B, D+1]
        if self.static_plan is None:  # eager mode grows the history (a host sync); compiled mode made room at start
            needed = int(self.lengths.max()) + new.shape[1]
            if needed > self.history.shape[1]:
                grown = max(needed, 2 * self.history.shape[1])
                self.history = torch.nn.functional.pad(self.history, (0, grown - self.history.shape[1]))
        steps = torch.arange(new.shape[1], device=new.device)
        width = self.history.shape[1]  # only a compiled batch's stopped rows, which keep committing, reach it
        target = (self.lengths[:, None] + steps).clamp(max=width - 1)  # [B, D+1]; past the count: unused slots
        write_columns_(self.history, target, new)
        self.lengths = (self.lengths + result.num_accepted + 1).clamp(max=width)

    def select_rows(self, rows: Tensor) -> None:
        self.history, self.lengths = self.history[rows], self.lengths[rows]
