"""SpeculativeGenerator: the public round step (draft -> verify -> accept -> commit) and the loop over it.

The prompt minus its last token is prefilled; the last prompt token is the first round's root, so every
generated token comes out of a verify forward and `mean_accepted` is exactly tokens per target forward.
A target whose prompt is all conditioning (class labels, captions: `input_ids` of shape [B, 0] plus model
inputs) returns the first token's logits from its prefill, and that token is drawn here, counted as one
target forward. Rows accept different numbers of tokens (a length per row, no crop to the shortest row);
rows that meet a stopping criterion (EOS, the budget, or a pluggable one) leave the batch.

Modality packages drive the same step (`begin`, `step`, `select_rows`, `end`) instead of copying the loop.
"""

from __future__ import annotations

import functools
import logging
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from specmm.core.acceptance import EXACT, AcceptanceRule, accept, check_rule
from specmm.core.compiled import (CompileClock, CompiledRound, StaticPlan, graph_mode, held_modules, settings_key,
                                  shared_round, taped_rounds)
from specmm.core.compiled_accept import accept_traceable
from specmm.core.resident import owner_of, resident
from specmm.core.static_cache import static_cache_length
from specmm.core.drafters import Drafter, accepted_tokens
from specmm.core.finite import raise_nonfinite_round, round_flags
from specmm.core.limits import check_generation_positions, check_tree_vocab, shared_rope_threshold
from specmm.core.profiling import RoundTimer
from specmm.core.processors import History, TreeLogitsProcessor, resolve_special_tokens
from specmm.core.sampling import GREEDY, Generators, SamplingConfig, process_logits, sample, select_generators
from specmm.core.stats import GenerationStats
from specmm.core.target import FEATURES, Target, as_target
from specmm.core.tree import DraftTree, TreeSpec, limit_depth

logger = logging.getLogger(__name__)


@dataclass
class GenerationOutput:
    sequences: Tensor  # [B, L + n] prompt as given, then new tokens, right-padded with pad_token_id
    stats: GenerationStats


@dataclass
class RoundOutput:
    """What one round did for each live row (b rows, tree depth D)."""

    tree: DraftTree | None  # the verified draft tree (None for a token drawn from a conditioning prefill)
    path: Tensor  # [b, D+1] accepted path, root first (junk past num_accepted)
    num_accepted: Tensor  # [b] accepted draft tokens
    next_token: Tensor  # [b] the target's token after the path (bonus or correction): the next root
    new_tokens: Tensor  # [b, D+1] accepted drafts, then next_token at index num_accepted (junk past it)
    diagnostics: dict[str, Tensor] = field(default_factory=dict)  # the rule's own, each [b, D] per accepted draft
    target_logits: Tensor | None = None  # [b, T, V] verify logits after each node, generation_config processors applied


@runtime_checkable
class StoppingCriterion(Protocol):
    """Says where rows stop inside a round's new tokens (EOS, a step delimiter, ...)."""

    def __call__(self, new_tokens: Tensor, counts: Tensor, rows: Tensor) -> Tensor:
        """[b, n] bool: the row stops right after this token. new_tokens: [b, n]; counts: [b] how many of them
        are real (the rest is junk to ignore); rows: [b] each live row's index in the original batch."""
        ...


class EosCriterion:
    """Stop after any of `eos_ids`."""

    def __init__(self, eos_ids: Sequence[int], device: torch.device):
        self.eos_ids = torch.tensor(list(eos_ids), dtype=torch.long, device=device)

    def __call__(self, new_tokens: Tensor, counts: Tensor, rows: Tensor) -> Tensor:
        return torch.isin(new_tokens, self.eos_ids)


@dataclass
class RoundState:
    """What a generation's rounds read and write in place, besides the models' caches (B rows, tree depth D).

    Allocated once per generation before the first round (under CUDA graphs, the same buffers for every generation
    of these shapes); every round, eager or one graph, updates it with the same ops. The budget, pad and EOS ids are
    values here, not shapes or constants of a graph, so a generation with other values compiles nothing new.
    """

    out: Tensor  # [B, C + D + 1] kept tokens, right-padded with pad (C: the budget, bucketed in the fast mode)
    counts: Tensor  # [B] new tokens per original row
    rounds: Tensor  # [B] target forwards that kept tokens, per original row
    alive: Tensor  # [B] bool: the row has not stopped
    histogram: Tensor  # [D + 1] rounds per number of accepted drafts
    moved: Tensor  # [] moved mass of the kept drafts (lossy rules)
    budget: Tensor  # [1] max_new_tokens
    pad: Tensor  # [1] pad id
    eos: Tensor | None  # [E] EOS ids (None: no EOS)


def record_round(new: Tensor, num_accepted: Tensor, active: Tensor, state: RoundState,
                 criteria: Sequence[StoppingCriterion] = ()) -> Tensor:
    """Write each live row's kept tokens of the round into `state` and update its counters and alive flags in place;
    returns take [b], the tokens each row kept. new: [b, n] accepted drafts then the next token; num_accepted: [b];
    active: [b] each live row's original row. A row keeps up to its budget and stops after an EOS id or where a
    criterion says; rows that stopped earlier keep nothing."""
    counts = state.counts[active]  # [b]
    remaining = state.budget - counts
    take = torch.where(state.alive[active], torch.minimum(num_accepted + 1, remaining), 0)
    state.histogram += (torch.nn.functional.one_hot(num_accepted, state.histogram.numel()) * (take > 0)[:, None]).sum(0)
    done = take >= remaining
    steps = torch.arange(new.shape[1], device=new.device)
    stops = [] if state.eos is None else [torch.isin(new, state.eos)]
    for stop in stops + [criterion(new, take, active) for criterion in criteria]:
        stop = stop & (steps[None, :] < take[:, None])  # [b, n]
        hit = stop.any(1)
        first = torch.where(stop, steps[None, :], new.shape[1]).amin(1)  # [b] first stop (n: none)
        take = torch.where(hit, first + 1, take)
        done = done | hit
    state.out[active[:, None], counts[:, None] + steps] = torch.where(steps[None, :] < take[:, None], new, state.pad)
    state.counts[active] = counts + take
    state.rounds[active] += (take > 0).long()
    state.alive[active] = state.alive[active] & ~done
    return take


def add_kept_moved_mass(moved: Tensor, result: RoundOutput, take: Tensor) -> None:
    """Add the moved mass of the drafts each row kept (its first `take` [b] of D) to `moved` [], in place."""
    if "moved_mass" in result.diagnostics:
        per_draft = result.diagnostics["moved_mass"]  # [b, D]
        moved += (per_draft * (torch.arange(per_draft.shape[1], device=take.device)[None, :] < take[:, None])).sum()


def undecorated_step(cls: type) -> Callable:
    """`cls.step` without its no_grad decorator (the loop holds no_grad; a compiled frame must be the step's own)."""
    return getattr(cls.step, "__wrapped__", cls.step)


def recorded_round(gen: SpeculativeGenerator, roots: Tensor, sampling: SamplingConfig, generators: Generators,
                   history: History | None, state: RoundState, active: Tensor,
                   criteria: Sequence[StoppingCriterion]) -> tuple[RoundOutput, Tensor, Tensor]:
    """One round with its bookkeeping, the unit both tiers run (eagerly, or as one graph in the fast mode):
    1. the round step of the live rows `active` [b]; 2. `record_round` (tokens into `state`, counters, alive flags);
    3. the moved mass of the kept drafts; 4. the stop flags [3] (every row done, any verify logits non-finite, any
    live row stopped), which the loop reads in its one host sync. Returns (the round, take [b], the flags)."""
    alive = state.alive[active]
    result = undecorated_step(type(gen))(gen, roots, sampling, generators, alive, state.budget - state.counts[active],
                                         history)
    take = record_round(result.new_tokens, result.num_accepted, active, state, criteria)
    add_kept_moved_mass(state.moved, result, take)
    flags = torch.cat([round_flags((~state.alive).all()[None], result.target_logits),
                       (~state.alive[active]).any()[None]])
    return result, take, flags


def synchronize(device: torch.device) -> None:
    """Wait for the device, so wall times are honest."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class SpeculativeGenerator:
    """Speculative decoding of a target with a drafter, over batches, chains or trees."""

    def __init__(self, target, drafter: Drafter, tree: TreeSpec | None = None,
                 acceptance: str | AcceptanceRule = "exact", compile: bool = False, profile: bool = False):
        """`compile=True` is the fast mode: static caches, rows that stay in the batch (static shapes), each round
        (draft, verify, accept, commit, record) one `torch.compile`d graph (CUDA graphs on CUDA), one host sync per
        round; outputs are identical. A round that cannot be one graph runs eagerly, with one warning naming why.
        `profile=True` records where each round's time goes (`stats.round_time_split`), running rounds eagerly and
        syncing the device at every phase boundary: use it in a separate run, not a timed one."""
        self.target: Target = as_target(target)
        if not isinstance(drafter, Drafter):
            raise ValueError(f"drafter: {type(drafter).__name__} does not implement the specmm Drafter protocol")
        if drafter.vocab_size is not None and drafter.vocab_size != self.target.vocab_size:
            raise ValueError(f"drafter: vocabulary size {drafter.vocab_size} does not match the target's "
                             f"{self.target.vocab_size}")
        if drafter.device is not None and torch.device(drafter.device) != torch.device(self.target.device):
            raise ValueError(f"drafter: on {drafter.device} but the target is on {self.target.device}; "
                             "put both on the same device")
        self.tree = tree if tree is not None else TreeSpec.chain(4)
        if not isinstance(self.tree, TreeSpec):
            raise ValueError(f"tree: expected a TreeSpec, got {type(self.tree).__name__}")
        drafter.check_spec(self.tree)
        check_tree_vocab(self.tree, self.target.vocab_size)
        if acceptance == "exact" or acceptance == "greedy":
            self.rule: AcceptanceRule = EXACT
        elif isinstance(acceptance, AcceptanceRule):
            self.rule = acceptance
        else:
            raise ValueError(f"acceptance: expected 'exact', 'greedy' or an AcceptanceRule, got {acceptance!r}")
        self.greedy_only = acceptance == "greedy"
        self.drafter = drafter
        if hasattr(drafter, "position_cap"):
            drafter.position_cap = shared_rope_threshold(getattr(self.target, "model", None),
                                                         getattr(drafter, "model", None))
        self.processor: TreeLogitsProcessor | None = None  # the model's generation_config processors, per generate
        if not isinstance(compile, bool):
            raise ValueError(f"compile: expected True or False, got {compile!r}")
        self.compile = compile
        self.profile = bool(profile)
        self.timer: RoundTimer | None = None
        self._plan: StaticPlan | None = None  # compiled mode's plan of the current generation
        self._compiled_round: CompiledRound | None = None  # compiled mode's whole-round graphs, made on first use
        if compile:
            self._check_fast_path()

    def _check_fast_path(self) -> None:
        """Say, once and before any work, which parts cannot take the fast path and run eager instead."""
        for role, part in (("target", self.target), ("drafter", self.drafter)):
            if hasattr(part, "static_plan"):
                continue
            note = getattr(part, "fast_path_note", None)
            if note is not None:
                logger.info("compile=True: the %s %s stays eager (%s)", role, type(part).__name__, note)
            else:
                warnings.warn(f"compile=True: the {role} {type(part).__name__} has no static-cache path; it runs "
                              "eager (outputs are unchanged)", RuntimeWarning, stacklevel=3)

    def static_plan(self, prompt_length: int, max_new_tokens: int) -> StaticPlan:
        """Cache slots for the prompt, the budget and one tree round, bucketed so similar calls share shapes."""
        reserve = self.tree.num_nodes + self.tree.depth + 2  # one round: pending tokens and the tree
        return StaticPlan(max_len=static_cache_length(prompt_length + max_new_tokens + reserve), reserve=reserve,
                          compile=True, mode=graph_mode(self.target.device), round_tokens=self.tree.depth + 1)

    def _check_inputs(self, input_ids, attention_mask, max_new_tokens, sampling, eos_token_id, pad_token_id,
                      generator, streamer, model_inputs) -> tuple[Tensor, Tensor, list[int]]:
        if not isinstance(input_ids, Tensor) or input_ids.dim() != 2:
            raise ValueError("input_ids: expected a [batch, length] LongTensor")
        conditioned = input_ids.shape[1] == 0
        if input_ids.shape[0] == 0 or (conditioned and not model_inputs):
            raise ValueError(f"input_ids: empty input of shape {tuple(input_ids.shape)} (a [B, 0] prompt needs "
                             "conditioning model inputs)")
        if input_ids.dtype not in (torch.long, torch.int):
            raise ValueError(f"input_ids: expected integer token ids, got {input_ids.dtype}")
        vocab = self.target.vocab_size
        if not conditioned and (int(input_ids.min()) < 0 or int(input_ids.max()) >= vocab):
            raise ValueError(f"input_ids: token ids must be in [0, {vocab})")
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if not isinstance(attention_mask, Tensor) or attention_mask.shape != input_ids.shape:
            shape = tuple(attention_mask.shape) if isinstance(attention_mask, Tensor) else type(attention_mask)
            raise ValueError(f"attention_mask: shape {shape} does not match input_ids {tuple(input_ids.shape)}")
        if not conditioned and not bool(attention_mask[:, -1].bool().all()):
            raise ValueError("attention_mask: the last column must be all ones (pad prompts on the left)")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens: expected an integer >= 1, got {max_new_tokens!r}")
        if not isinstance(sampling, SamplingConfig):
            raise ValueError(f"sampling: expected a SamplingConfig, got {type(sampling).__name__}")
        if self.greedy_only and not sampling.greedy:
            raise ValueError("acceptance: 'greedy' needs sampling temperature 0; use 'exact' to sample")
        check_rule(self.rule, sampling)
        eos = [] if eos_token_id is None else ([eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id))
        if any(not isinstance(e, int) or not 0 <= e < vocab for e in eos):
            raise ValueError(f"eos_token_id: expected ids in [0, {vocab}), got {eos_token_id!r}")
        # stock checkpoints (specmm.core.limits): pad id in the vocabulary, positions the model gives exactly
        if pad_token_id is not None and (isinstance(pad_token_id, bool) or not isinstance(pad_token_id, int)
                                         or not 0 <= pad_token_id < vocab):
            raise ValueError(f"pad_token_id: expected an id in [0, {vocab}) (argument or the model's "
                             f"generation_config), got {pad_token_id!r}")
        check_generation_positions(getattr(self.target, "model", None), attention_mask, max_new_tokens,
                                   cache_slots=self.static_plan(attention_mask.shape[1], max_new_tokens).max_len)
        if generator is not None and not isinstance(generator, torch.Generator):
            if len(generator) != input_ids.shape[0]:
                raise ValueError(f"generator: expected one generator or {input_ids.shape[0]} (one per row), "
                                 f"got {len(generator)}")
        if streamer is not None and not (hasattr(streamer, "put") and hasattr(streamer, "end")):
            raise ValueError("streamer: expected an object with put() and end() (like transformers' TextStreamer)")
        device = self.target.device
        return input_ids.to(device).long(), attention_mask.to(device).long(), eos

    # ------------------------------------------------------------------ the round step
    @torch.no_grad()
    def begin(self, input_ids: Tensor, attention_mask: Tensor, sampling: SamplingConfig = GREEDY,
              generators: Generators = None, max_new_tokens: int = 64, **model_inputs) -> Tensor:
        """Start a generation: prefill the target (and its conditioning) and the drafter.

        Returns the first roots [B]: the prompt's last token, or, for a [B, 0] prompt of conditioning inputs
        only, a token drawn from the target's prefill logits (the caller counts it as generated).
        """
        target, drafter = self.target, self.drafter
        plan = self._plan = self.static_plan(input_ids.shape[1], max_new_tokens) if self.compile else None
        for part in (target, drafter):  # a part shared with an eager generator goes back to eager there
            if hasattr(part, "static_plan"):
                part.static_plan = plan
        target.start(input_ids.shape[0], needs=drafter.needs)
        if input_ids.shape[1] == 0:
            prefill = target.prefill(input_ids, attention_mask, **model_inputs)
            if prefill.next_logits is None:
                raise ValueError(f"input_ids: {type(target).__name__} needs at least one prompt token")
            logits = prefill.next_logits  # [B, V]
            first = logits.argmax(-1) if sampling.greedy else sample(process_logits(logits, sampling), generators)
            input_ids, attention_mask = first[:, None], torch.ones_like(first)[:, None]
        else:
            prefill = target.prefill(input_ids[:, :-1], attention_mask[:, :-1], **model_inputs)
        drafter.start(input_ids, attention_mask, prefill)
        # strides of the roots a round returns (a [1] view keeps stride L): compiled mode's guards match, one graph
        roots = input_ids[:, -1].clone(memory_format=torch.contiguous_format)
        if hasattr(target, "check_roots"):  # a target's checks of the first roots, here and not in a round's graph
            target.check_roots(roots)
        return roots

    @torch.no_grad()
    def step(self, roots: Tensor, sampling: SamplingConfig = GREEDY, generators: Generators = None,
             alive: Tensor | None = None, budget: Tensor | None = None,
             history: History | None = None) -> RoundOutput:
        """One round for the live rows: draft a tree under `roots` [b], verify it in one target forward,
        accept a path per row, commit it to the target's cache and tell the drafter.

        alive: [b] bool, for rows kept in the batch after they stopped (compiled mode keeps shapes static):
        those rows accept nothing and commit only their root, so their caches stay within bounds.
        budget: [b] tokens each row may still take: deeper tree nodes are cut before the verify.
        history: each row's sequence so far, which the generation_config processors (`self.processor`) read.
        """
        target, drafter, timer = self.target, self.drafter, self.timer
        if timer is not None:
            timer.mark("other")  # the loop's bookkeeping since the last round
        if self.processor is not None and getattr(drafter, "processes_drafts", False):
            process = functools.partial(self.processor.process_paths, history=history)  # drafts follow the rules
            tree = drafter.draft(roots, self.tree, sampling, generators, process=process)
        else:
            tree = drafter.draft(roots, self.tree, sampling, generators)
        if budget is not None:
            tree = limit_depth(tree, budget - 1)  # no node past a row's budget
        if timer is not None:
            timer.mark("draft")
        verified = target.verify(tree)
        logits = verified.logits  # [b, T, V]
        if self.processor is not None:  # generation_config's processors, each node after its own sequence
            logits = self.processor(logits, tree, history)
        if timer is not None:
            timer.mark("verify")
        if self._plan is not None:  # the walk in a form the round's graph traces: same draws, same tokens
            result = accept_traceable(tree, logits, sampling, self.rule, generators)
        else:
            result = accept(tree, logits, sampling, self.rule, generators)
        if alive is not None:
            result.num_accepted = torch.where(alive, result.num_accepted, 0)
        target.commit(result.path, result.num_accepted + 1)
        path_features = None
        if FEATURES in drafter.needs:
            index = result.path[:, :, None].expand(*result.path.shape, verified.features.shape[-1])
            path_features = verified.features.gather(1, index)
        drafter.update(tree, result, path_features)
        if timer is not None:
            timer.mark("accept_commit")
        return RoundOutput(tree=tree, path=result.path, num_accepted=result.num_accepted,
                           next_token=result.next_token, new_tokens=accepted_tokens(tree, result),
                           diagnostics=result.diagnostics, target_logits=logits)

    def select_rows(self, rows: Tensor) -> None:
        """Keep only `rows` [b'] of the live batch in the target and the drafter (between rounds)."""
        self.target.select_rows(rows)
        self.drafter.select_rows(rows)

    def end(self) -> None:
        """Release per-generation state (the target's hooks and caches)."""
        self.target.close()

    # ------------------------------------------------------------------ the loop
    @torch.no_grad()
    def generate(self, input_ids: Tensor, attention_mask: Tensor | None = None, max_new_tokens: int = 64,
                 sampling: SamplingConfig = GREEDY, eos_token_id: int | Sequence[int] | None = None,
                 pad_token_id: int | None = None, generator: Generators = None, streamer=None,
                 stopping: Sequence[StoppingCriterion] = (), **model_inputs) -> GenerationOutput:
        """Generate up to `max_new_tokens` per row from left-padded `input_ids` [B, L].

        `model_inputs` (e.g. `pixel_values`, or a conditioning-only target's conditions) go to the target's
        prefill. `stopping` adds criteria to EOS and the budget. `eos_token_id` / `pad_token_id` default to the
        target model's `generation_config` (`eos_token_id=[]`: no EOS even when it sets one), whose logits
        processors apply at every tree node (or are refused before any work; see `specmm.core.processors`).
        Sampling warpers come from `sampling` alone.
        """
        model = getattr(self.target, "model", None)
        eos_token_id, pad_token_id = resolve_special_tokens(model, eos_token_id, pad_token_id)
        input_ids, attention_mask, eos = self._check_inputs(
            input_ids, attention_mask, max_new_tokens, sampling, eos_token_id, pad_token_id, generator, streamer,
            model_inputs)
        self.processor = TreeLogitsProcessor.from_model(model, eos)  # None when the generation config sets none
        if any(not isinstance(c, StoppingCriterion) for c in stopping):
            raise ValueError("stopping: expected StoppingCriterion callables (new_tokens, counts, rows) -> [b, n] bool")
        self.target.check_model_inputs(model_inputs)
        device = self.target.device
        pad = pad_token_id if pad_token_id is not None else (eos[0] if eos else 0)
        compiling_before = CompileClock.seconds
        synchronize(device)
        started = time.perf_counter()
        _stream_prompt(streamer, input_ids, attention_mask)
        try:
            state, stats = self._loop(input_ids, attention_mask, max_new_tokens, sampling, eos, list(stopping), pad,
                                      generator, streamer, model_inputs)
        finally:
            self.end()  # removes any feature hook from the user's model
        if streamer is not None:
            streamer.end()
        synchronize(device)
        stats.compile_time_s = CompileClock.seconds - compiling_before
        stats.wall_time_s = time.perf_counter() - started
        stats.draft_forwards = self.drafter.draft_forwards
        stats.new_tokens_per_row = state.counts.tolist()
        stats.target_forwards_per_row = state.rounds.tolist()
        stats.new_tokens = sum(stats.new_tokens_per_row)
        stats.accepted_histogram = state.histogram.tolist()
        width = int(state.counts.max())
        out = state.out[:, :width]
        return GenerationOutput(sequences=torch.cat([input_ids, out], 1), stats=stats)

    def _loop(self, input_ids, attention_mask, max_new_tokens, sampling, eos, stopping, pad, generator, streamer,
              model_inputs):
        """`begin`, then rounds until every row has stopped: one loop for both tiers, the round state on the device,
        one host sync per round. Eager mode drops stopped rows from the batch; the fast mode keeps its shapes."""
        device, batch = self.target.device, input_ids.shape[0]
        stats, generators = GenerationStats(), generator
        roots = self.begin(input_ids, attention_mask, sampling, generators, max_new_tokens, **model_inputs)
        state = self._round_state(batch, max_new_tokens, pad, eos)  # after `begin`, which makes the plan
        active = torch.arange(batch, device=device)  # original row of each live row
        self.timer = RoundTimer(device) if self.profile else None
        if self.timer is not None:
            self.timer.reset()
        step = self._round_step(sampling)
        if input_ids.shape[1] == 0:  # the conditioning prefill drew the first token
            stats.target_forwards += 1
            take = record_round(roots[:, None], torch.zeros_like(roots), active, state, stopping)
            _stream_round(streamer, batch, active, roots[:, None], take)
            if not self.compile:  # eager mode: rows that stopped at their first token leave (a host sync)
                roots, active, generators = self._drop_stopped(state, roots, active, generators)
                if active.numel() == 0:
                    return state, self._finish(stats, state.moved)
        while True:
            history = None if self.processor is None else History.of(input_ids, attention_mask, state.out,
                                                                      state.counts, active)
            result, take, flags = step(roots, sampling, generators, history, state, active, stopping)
            roots = result.next_token
            stats.target_forwards += 1
            _stream_round(streamer, batch, active, result.new_tokens, take)
            all_done, any_bad, any_stopped = flags.tolist()  # the round's one host sync
            if any_bad:
                raise_nonfinite_round(result.target_logits, self.target, state.rounds[active])
            if all_done:
                return state, self._finish(stats, state.moved)
            if any_stopped and not self.compile:  # eager mode: stopped rows leave the batch
                roots, active, generators = self._drop_stopped(state, roots, active, generators)

    def _drop_stopped(self, state: RoundState, roots: Tensor, active: Tensor, generators: Generators
                      ) -> tuple[Tensor, Tensor, Generators]:
        """Eager mode: the live rows whose `state.alive` is still set stay in the target, the drafter, the roots [b],
        the original-row indices `active` [b] and the generators; the others leave (one host sync)."""
        keep = state.alive[active].nonzero().flatten()
        if keep.numel() == active.numel():
            return roots, active, generators
        if keep.numel():  # none left: the generation ends, with the models untouched
            self.select_rows(keep)
        return roots[keep], active[keep], select_generators(generators, keep.tolist())

    def _round_state(self, batch: int, max_new_tokens: int, pad: int, eos: list[int]) -> RoundState:
        """A generation's `RoundState`. Spare columns let a round's tokens always be written past a row's count (then
        overwritten or cut); the fast mode buckets the budget, so generations of other budgets share its shapes.
        Under CUDA graphs every buffer is the one kept for its shape, so recorded graphs replay."""
        device, depth = self.target.device, self.tree.depth
        columns = static_cache_length(max_new_tokens) if self.compile else max_new_tokens
        mode = None if self._plan is None else self._plan.mode
        keep = functools.partial(resident, owner_of(self.target), mode=mode)
        long = dict(dtype=torch.long, device=device)
        return RoundState(
            out=keep("out", torch.full((batch, columns + depth + 1), pad, **long)),
            counts=keep("counts", torch.zeros(batch, **long)), rounds=keep("rounds", torch.zeros(batch, **long)),
            alive=keep("alive", torch.ones(batch, dtype=torch.bool, device=device)),
            histogram=keep("histogram", torch.zeros(depth + 1, **long)),
            moved=keep("moved", torch.zeros((), device=device)),
            budget=keep("budget", torch.full((1,), max_new_tokens, **long)),
            pad=keep("pad", torch.full((1,), pad, **long)),
            eos=keep("eos", torch.tensor(eos, **long)) if eos else None)

    def _finish(self, stats: GenerationStats, moved: Tensor) -> GenerationStats:
        stats.moved_mass = float(moved)
        if self.timer is not None:
            self.timer.mark("other")
            stats.round_time_split = dict(self.timer.seconds)
            self.timer = None
        return stats

    def _uniform_first_round(self) -> bool:
        """Whether the first round's state has the later rounds' shapes and its checks no host sync, so that a greedy
        fast-mode generation runs it through the later rounds' graph (else eagerly, as a warm-up)."""
        return all(getattr(part, "uniform_first_round", False) for part in (self.target, self.drafter))

    @property
    def whole_round(self) -> bool | None:
        """Fast mode: whether the rounds ran as one compiled graph (False: the round could not trace as one graph, and
        the generation ran eagerly, after one RuntimeWarning naming why); None until a fast generation has run."""
        if self._compiled_round is None:
            return None
        return self._compiled_round.failed is None

    def _round_step(self, sampling: SamplingConfig):
        """The two tiers: every round eagerly (`recorded_round`), or in the fast mode as one compiled graph per shape,
        made once and reused across `generate` calls. A greedy first round runs the graph too where target and drafter
        start in the later rounds' shapes (`_uniform_first_round`), else eagerly. Sampled rounds read their draws from
        a `DrawTape` recorded by the first one or two rounds, run eagerly (`taped_rounds`), so seeded outputs stay
        eager mode's. Profiling runs eagerly: its split needs the phase boundaries."""
        eager = functools.partial(recorded_round, self)
        plan = self._plan
        if plan is None or not plan.compile or self.profile:
            return eager
        key = (type(self.target), type(self.drafter), repr(self.tree), settings_key(self.rule))
        modules = held_modules(self.target, self.drafter)
        self._compiled_round = shared_round(recorded_round, key, modules, plan.mode)
        whole = functools.partial(self._compiled_round, self)
        if not sampling.greedy:
            return taped_rounds(eager, whole, self.target.device, self._compiled_round.repeating_tapes,
                                settings_key(self.drafter))
        if self._uniform_first_round():
            return whole
        rounds = iter([eager])
        return lambda *args: next(rounds, whole)(*args)


def _stream_prompt(streamer, input_ids: Tensor, attention_mask: Tensor) -> None:
    """Like HF: the prompt goes first. Batch 1 gets a [1, L] tensor; larger batches a list of 1-D rows."""
    if streamer is None:
        return
    if input_ids.shape[0] == 1:
        streamer.put(input_ids.cpu())
    else:
        streamer.put([row[mask.bool()].cpu() for row, mask in zip(input_ids, attention_mask)])


def _stream_round(streamer, batch: int, active: Tensor, new: Tensor, take: Tensor) -> None:
    """Each round's kept tokens: [1, n] for batch 1, else a list with one 1-D tensor per original row."""
    if streamer is None:
        return
    new, take, active = new.cpu(), take.tolist(), active.tolist()
    if batch == 1:
        streamer.put(new[:, : take[0]])
        return
    chunks = [torch.empty(0, dtype=torch.long) for _ in range(batch)]
    for i, row in enumerate(active):
        chunks[row] = new[i, : take[i]]
    streamer.put(chunks)
