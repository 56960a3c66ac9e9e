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
from specmm.core.compiled import (CompileClock, CompiledRound, StaticPlan, as_first_round, compiled_helper,
                                  graph_mode, held_modules, settings_key, shared_round, taped_rounds)
from specmm.core.compiled_accept import accept_compiled
from specmm.core.resident import owner_of, resident
from specmm.core.static_cache import static_cache_length
from specmm.core.drafters import Drafter, accepted_tokens
from specmm.core.finite import raise_nonfinite_round, round_flags, stopped
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


def record_round(new: Tensor, num_accepted: Tensor, out: Tensor, counts: Tensor, rounds: Tensor, histogram: Tensor,
                 alive: Tensor, eos_ids: Tensor | None, max_new_tokens: Tensor | int, pad: Tensor | int) -> Tensor:
    """Compiled mode's `_record` (rows never leave the batch; EOS the only criterion): write each live row's kept
    tokens of the round into `out` and update `counts`, `rounds`, `histogram` and `alive` in place; returns take
    [B], the tokens each row kept. new: [B, n]; num_accepted: [B]; eos_ids: [E] or None; max_new_tokens and pad: [1]
    or ints."""
    remaining = max_new_tokens - counts  # [B]
    take = torch.where(alive, torch.minimum(num_accepted + 1, remaining), 0)
    histogram += (torch.nn.functional.one_hot(num_accepted, histogram.numel()) * (take > 0)[:, None]).sum(0)
    done = take >= remaining
    steps = torch.arange(new.shape[1], device=new.device)
    if eos_ids is not None:
        stops = torch.isin(new, eos_ids) & (steps[None, :] < take[:, None])  # [B, n]
        hit = stops.any(1)
        first = torch.where(stops, steps[None, :], new.shape[1]).amin(1)  # [B] first EOS (n: none)
        take = torch.where(hit, first + 1, take)
        done = done | hit
    rows = torch.arange(new.shape[0], device=new.device)
    out[rows[:, None], counts[:, None] + steps] = torch.where(steps[None, :] < take[:, None], new, pad)
    counts += take
    rounds += (take > 0).long()
    alive &= ~done
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
                   alive: Tensor, history: History | None, out: Tensor, counts: Tensor, rounds: Tensor,
                   histogram: Tensor, moved: Tensor, eos_ids: Tensor | None, max_new_tokens: Tensor, pad: Tensor
                   ) -> tuple[RoundOutput, Tensor]:
    """Compiled mode's round with its bookkeeping, so that one compiled graph does both (rows never leave the batch;
    EOS the only criterion): 1. the round step; 2. `record_round` (tokens into `out`, counters, `alive`, in place);
    3. the moved mass of the kept drafts into `moved` []; 4. the stop flags [2] (every row done, any verify logits
    non-finite), which the loop reads in its one host sync. Outside a compiled graph each part runs compiled on its
    own. alive, counts, rounds: [B]; out: [B, bucketed max_new_tokens + D + 1]; histogram: [D + 1]; eos_ids: [E] or
    None; max_new_tokens, pad: [1] (values of the state, so that every budget and pad id share the graph)."""
    result = undecorated_step(type(gen))(gen, roots, sampling, generators, alive, max_new_tokens - counts, history)
    take = compiled_helper(record_round)(result.new_tokens, result.num_accepted, out, counts, rounds, histogram, alive,
                                         eos_ids, max_new_tokens, pad)
    add_kept_moved_mass(moved, result, take)
    flags = compiled_helper(round_flags)((~alive).all()[None], result.target_logits)
    return result, flags


def synchronize(device: torch.device) -> None:
    """Wait for the device, so wall times are honest."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class SpeculativeGenerator:
    """Speculative decoding of a target with a drafter, over batches, chains or trees."""

    def __init__(self, target, drafter: Drafter, tree: TreeSpec | None = None,
                 acceptance: str | AcceptanceRule = "exact", compile: bool = False, profile: bool = False):
        """`compile=True` is the fast path: static caches, rows that stay in the batch (static shapes),
        `torch.compile`d forwards (CUDA graphs on CUDA), one host sync per round; outputs are identical.
        `profile=True` records where each round's time goes (`stats.round_time_split`), syncing the device
        at every phase boundary: use it in a separate run, not a timed one."""
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
            tree = limit_depth(tree, budget - 1, compiled=self._plan is not None)  # no node past a row's budget
        if timer is not None:
            timer.mark("draft")
        verified = target.verify(tree)
        logits = verified.logits  # [b, T, V]
        if self.processor is not None:  # generation_config's processors, each node after its own sequence
            logits = self.processor(logits, tree, history)
        if timer is not None:
            timer.mark("verify")
        if self._plan is not None:  # the walk as one compiled graph, same draws, same tokens
            result = accept_compiled(tree, logits, sampling, self.rule, generators, self._plan)
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
        criteria = ([EosCriterion(eos, device)] if eos else []) + list(stopping)
        compiling_before = CompileClock.seconds
        synchronize(device)
        started = time.perf_counter()
        _stream_prompt(streamer, input_ids, attention_mask)
        try:
            out, counts, rounds, histogram, stats = self._loop(
                input_ids, attention_mask, max_new_tokens, sampling, criteria, pad, generator, streamer,
                model_inputs)
        finally:
            self.end()  # removes any feature hook from the user's model
        if streamer is not None:
            streamer.end()
        synchronize(device)
        stats.compile_time_s = CompileClock.seconds - compiling_before
        stats.wall_time_s = time.perf_counter() - started
        stats.draft_forwards = self.drafter.draft_forwards
        stats.new_tokens_per_row = counts.tolist()
        stats.target_forwards_per_row = rounds.tolist()
        stats.new_tokens = sum(stats.new_tokens_per_row)
        stats.accepted_histogram = histogram.tolist()
        width = int(counts.max())
        return GenerationOutput(sequences=torch.cat([input_ids, out[:, :width]], 1), stats=stats)

    def _loop(self, input_ids, attention_mask, max_new_tokens, sampling, criteria, pad, generator, streamer,
              model_inputs):
        """`begin`, then `step` until every row has stopped; counters stay on the device until the end."""
        device, batch = self.target.device, input_ids.shape[0]
        # spare columns so a round's tokens can always be written past a row's count (then overwritten or cut); in
        # compiled mode the budget is bucketed, so that generations of other budgets share the round's shapes
        columns = static_cache_length(max_new_tokens) if self.compile else max_new_tokens
        out = torch.full((batch, columns + self.tree.depth + 1), pad, dtype=torch.long, device=device)
        counts = torch.zeros(batch, dtype=torch.long, device=device)  # new tokens per original row
        rounds = torch.zeros(batch, dtype=torch.long, device=device)  # target forwards per original row
        histogram = torch.zeros(self.tree.depth + 1, dtype=torch.long, device=device)
        moved = torch.zeros((), device=device)
        active = torch.arange(batch, device=device)  # original row of each live row
        stats, generators = GenerationStats(), generator
        alive = torch.ones(batch, dtype=torch.bool, device=device) if self.compile else None
        roots = self.begin(input_ids, attention_mask, sampling, generators, max_new_tokens, **model_inputs)
        # under CUDA graphs the round's state keeps its addresses across generations (other modes: as allocated)
        mode = None if self._plan is None else self._plan.mode
        keep = functools.partial(resident, owner_of(self.target), mode=mode)
        # the budget and the pad id are values of the round's state, not constants of its graph: a generation with
        # another of either compiles nothing new
        budget = torch.full((1,), max_new_tokens, dtype=torch.long, device=device)  # [1]: no 0-d scalar input
        pad_id = torch.full((1,), pad, dtype=torch.long, device=device)
        out, counts, rounds, histogram, moved, budget, pad_id = (keep(name, value) for name, value in (
            ("out", out), ("counts", counts), ("rounds", rounds), ("histogram", histogram), ("moved", moved),
            ("budget", budget), ("pad", pad_id)))
        self.timer = RoundTimer(device) if self.profile else None
        if self.timer is not None:
            self.timer.reset()
        if input_ids.shape[1] == 0:  # the conditioning prefill drew the first token
            first = RoundOutput(tree=None, path=None, num_accepted=torch.zeros_like(roots), next_token=roots,
                                new_tokens=roots[:, None])
            stats.target_forwards += 1
            roots, generators, active, _ = self._record(first, out, counts, rounds, histogram, active, roots,
                                                        generators, max_new_tokens, criteria, pad, streamer, batch,
                                                        alive)
        alive = keep("alive", torch.ones(batch, dtype=torch.bool, device=device)) if self.compile else None
        if alive is not None and streamer is None and all(type(c) is EosCriterion for c in criteria):
            eos = torch.cat([c.eos_ids for c in criteria]) if criteria else None  # one graph records the round too
            step = as_first_round(functools.partial(recorded_round, self))
            later_step = self._round_step(sampling, recorded=True)
            # sampled: the first round records the draw tape; greedy, where the parts start in the later rounds'
            # shapes, it runs the later rounds' graph
            step = step if sampling.greedy and not self._uniform_first_round() else later_step
            while True:
                history = None if self.processor is None else History.of(input_ids, attention_mask, out, counts, active)
                result, flags = step(roots, sampling, generators, alive, history, out, counts, rounds, histogram,
                                     moved, eos, budget, pad_id)
                step, roots = later_step, result.next_token
                stats.target_forwards += 1
                all_done, any_bad = flags.tolist()  # compiled mode's one host sync per round
                if any_bad:
                    raise_nonfinite_round(result.target_logits, self.target, rounds)
                if all_done:
                    break
            return out, counts, rounds, histogram, self._finish(stats, moved)
        step, later_step = as_first_round(self.step), self._round_step(sampling)
        step = step if sampling.greedy and not self._uniform_first_round() else later_step  # as above
        while active.numel():
            history = None if self.processor is None else History.of(input_ids, attention_mask, out, counts, active)
            result = step(roots, sampling, generators, alive, max_new_tokens - counts[active], history)
            step = later_step
            stats.target_forwards += 1
            roots, generators, active, take = self._record(result, out, counts, rounds, histogram, active,
                                                           result.next_token, generators, max_new_tokens,
                                                           criteria, pad, streamer, batch, alive)
            if alive is not None and stopped((~alive).all()[None], result.target_logits, self.target, rounds, True):
                break  # compiled mode's one host sync per round: every row done (or NaN/inf logits raised)
            add_kept_moved_mass(moved, result, take)
        return out, counts, rounds, histogram, self._finish(stats, moved)

    def _finish(self, stats: GenerationStats, moved: Tensor) -> GenerationStats:
        stats.moved_mass = float(moved)
        if self.timer is not None:
            self.timer.mark("other")
            stats.round_time_split = dict(self.timer.seconds)
            self.timer = None
        return stats

    def _uniform_first_round(self) -> bool:
        """Whether the first round's state has the later rounds' shapes and its checks no host sync, so that compiled
        mode runs it through the same graph (else per part: a graph of its own would cost a cold compile of its own)."""
        plan = self._plan
        return (plan is not None and plan.compile and not self.profile
                and all(getattr(part, "uniform_first_round", False) for part in (self.target, self.drafter)))

    @property
    def whole_round(self) -> bool | None:
        """Compiled mode: whether the rounds after the first ran as one compiled graph (False: they run per part,
        after a trace that failed, with one RuntimeWarning naming why); None until a compiled generation has run
        one. Sampled rounds read their draws from a `DrawTape`, so they run as one graph too, from the second round on
        where the first round draws as the later ones do (see `taped_rounds`), else from the third."""
        if self._compiled_round is None:
            return None
        return self._compiled_round.failed is None

    def _round_step(self, sampling: SamplingConfig, recorded: bool = False):
        """The step of every round after the first: `step`, or in compiled mode the whole step as one compiled
        graph per shape, made once and reused across `generate` calls; sampled rounds read their draws from a
        `DrawTape` (`taped_rounds`), so seeded outputs stay eager mode's. Not when profiling (its split needs the
        phase boundaries). A greedy first round runs this step too where target and drafter start in the later
        rounds' shapes (`_uniform_first_round`), else per part."""
        plan = self._plan
        per_part = functools.partial(recorded_round, self) if recorded else self.step
        if plan is None or not plan.compile or self.profile:
            return per_part
        key = (type(self.target), type(self.drafter), repr(self.tree), settings_key(self.rule))
        modules = held_modules(self.target, self.drafter)
        # the undecorated step (the loop runs under no_grad): torch's own decorator frame would be the compiled
        # frame, shared by every compiled function and outside the guard filter of `compile_static`
        step = recorded_round if recorded else undecorated_step(type(self))
        self._compiled_round = shared_round(step, key, modules, plan.mode)
        whole = functools.partial(self._compiled_round, self)
        if sampling.greedy:
            return whole
        return taped_rounds(per_part, whole, self.target.device, self._compiled_round.repeating_tapes,
                            settings_key(self.drafter))

    def _record(self, result: RoundOutput, out, counts, rounds, histogram, active, roots, generators,
                max_new_tokens, criteria, pad, streamer, batch, alive=None):
        """Write a round's kept tokens and apply the stopping criteria. Rows that stopped leave the batch, or,
        in compiled mode (`alive` [B] given), stay with nothing more kept: no host sync here."""
        new = result.new_tokens  # [b, n]
        if alive is not None and streamer is None and all(type(c) is EosCriterion for c in criteria):
            eos = torch.cat([c.eos_ids for c in criteria]) if criteria else None  # one compiled graph does it all
            take = compiled_helper(record_round)(new, result.num_accepted, out, counts, rounds, histogram, alive,
                                                 eos, max_new_tokens, pad)
            return roots, generators, active, take
        take = torch.minimum(result.num_accepted + 1, max_new_tokens - counts[active])
        if alive is not None:
            take = torch.where(alive, take, 0)
        counted = torch.nn.functional.one_hot(result.num_accepted, histogram.numel()) * (take > 0)[:, None]
        histogram += counted.sum(0)  # [D+1] (no bincount: it syncs on CUDA)
        done = take >= max_new_tokens - counts[active]
        steps = torch.arange(new.shape[1], device=new.device)
        for criterion in criteria:
            stops = criterion(new, take, active) & (steps[None, :] < take[:, None])
            hit = stops.any(1)
            take = torch.where(hit, stops.to(torch.uint8).argmax(1) + 1, take)
            done = done | hit
        out[active[:, None], counts[active][:, None] + steps] = torch.where(steps < take[:, None], new,
                                                                            out.new_tensor(pad))
        counts[active] += take
        rounds[active] += (take > 0).long()
        _stream_round(streamer, batch, active, new, take)
        if alive is not None:  # compiled mode: rows stay; the loop's one sync also checks the logits
            alive &= ~done
        elif stopped(done, result.target_logits, self.target, rounds[active]):  # + NaN/inf check, same sync
            keep = (~done).nonzero().flatten()
            self.select_rows(keep)
            roots = roots[keep]
            generators = select_generators(generators, keep.tolist())
            active = active[keep]
        return roots, generators, active, take


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
