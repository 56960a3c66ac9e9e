"""Row-asynchronous scheduling for `StepSpeculator` (schedule='async'): rows that never wait for each other.

Every row is its own state machine: it drafts a step (one draft token per iteration), is judged or routed,
regenerates the step with the target (one token, or one exact token-level speculation round, per iteration)
and is done. Each iteration runs each model over the rows that have work for it: the draft over the drafting
rows; the target over the rows being judged (the drafted step's prefill and the judge suffix) or regenerating,
in one forward; one core round over the rows speculating inside a regenerated step. Finished rows leave; with
`refill`, waiting prompts take their slots, so the batch stays full (continuous batching).

Caches stay with the core adapters (`ModelDrafter`, `HFCausalLMTarget`), one row per slot, each row's tokens
left-aligned (no realigning), in per-row buffers (`row_slots`, `specmm.core.slot_cache`). A pass over every row
runs in place; a pass over some rows runs on a view of them (`take_rows`, then `put_rows`: the view writes into
the batch's buffers, nothing is copied back). Every pass closes its round: draft tokens are committed as they
run, and a rejected draft step is rewound (`ModelState.drop_last`). A row meets the same forwards and draws from
its own generators as under lockstep, so its tokens, decisions, sources and log-probs are the same.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

from specmm.core.drafters import ModelDrafter
from specmm.core.finite import NonFiniteError, nonfinite_message, nonfinite_rows
from specmm.core.sampling import SamplingConfig, process_logits, sample
from specmm.core.stats import GenerationStats, ReasoningExtras
from specmm.core.target import HFCausalLMTarget
from specmm.reasoning.inner import close_round, open_round, speculate_round
from specmm.reasoning.policies import ORACLE_SAMPLING
from specmm.reasoning.rollout import DRAFT, TARGET, RowRecords
from specmm.reasoning.state import ModelState, StepDraw, left_pad, pack
from specmm.reasoning.steps import StepEnd

DRAFTING, JUDGING, REGENERATING, SPECULATING, DONE = "drafting", "judging", "regenerating", "speculating", "done"


@dataclass
class Limits:
    """What ends rows and steps, and how tokens are drawn (both schedules)."""

    max_new_tokens: int
    max_steps: int | None
    sampling: SamplingConfig
    eos: Tensor  # [E] EOS token ids


@dataclass
class Row:
    """One prompt's rollout: its phase, its generators and what it has written so far."""

    index: int  # position in the prompt list
    prompt: list[int]
    key: int  # the row's seed (or index): keys the policy's per-row randomness
    draft_gen: torch.Generator | None
    target_gen: torch.Generator | None
    joined: float  # perf_counter when it joined the batch
    slot: int = 0  # its row in the models' caches
    phase: str = DRAFTING
    score: float = math.nan  # the policy's score of the current step
    drafted: int = 0  # tokens of the current step's rejected draft
    target_steps: int = 0
    last_by_target: bool = False
    latency: float = 0.0
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    sources: list[int] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    decisions: list[bool | None] = field(default_factory=list)

    def last_token(self) -> int:
        return self.tokens[-1] if self.tokens else self.prompt[-1]


class _Pass:
    """One forward of a model over some of its rows: in place when they are the whole batch, else on a view of
    them whose lengths `close` takes back."""

    def __init__(self, home: ModelState, slots: list[int]):
        device = home.device
        self.home, self.slots = home, torch.tensor(slots, dtype=torch.long, device=device)
        # a subset runs on a view (no copy) rather than padded to the whole batch (on a 2-core CPU, Arbitrage at
        # batch 64: 4.4-4.6 s per 128 problems, against 4.75 s running in place from half the batch)
        self.in_place = len(slots) == home.batch
        self.state = home if self.in_place else home.take_rows(self.slots)
        self.at = self.slots if self.in_place else torch.arange(len(slots), device=device)  # rows in `state`
        self.count = self.state.pending_count[self.at]  # [b] each row's pending tail, run by this pass

    def run(self, extra: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor | None]:
        """Run each row's pending tail, then its extra tokens ([b, w], counts [b]); returns the logits [b, V]
        (and features [b, H] when captured) after each row's last token."""
        state = self.state
        count = torch.zeros_like(state.pending_count)
        count[self.at] = self.count
        extra_count = torch.zeros_like(count)
        parts = [(state.pending, count)]
        if extra is not None:
            tokens = extra[0].new_zeros(state.batch, extra[0].shape[1])
            tokens[self.at], extra_count[self.at] = extra
            parts.append((tokens, extra_count))
        out = state.run(*pack(parts))
        last = (count + extra_count - 1)[self.at].clamp_min(0)
        features = out.features[self.at, last] if out.features is not None else None
        return out.logits[self.at, last], features

    def close(self, tail: Tensor, keep: Tensor | None = None) -> None:
        """Keep keep[i] run tokens of row i (default: its pending tail); tail [b] becomes its pending token."""
        state = self.state
        full_keep = torch.zeros_like(state.pending_count)
        full_keep[self.at] = self.count if keep is None else keep
        tails, counts = state.pending.clone(), state.pending_count.clone()
        tails[self.at] = 0
        tails[self.at, 0], counts[self.at] = tail, 1
        state.close_round(full_keep, tails, counts)
        if not self.in_place:
            self.home.put_rows(self.slots, state)
            self.home.forwards += state.forwards


class _View:
    """The StepView a policy sees for the rows deciding now (see `specmm.reasoning.policies.StepView`)."""

    def __init__(self, run: RowScheduler, rows: list[Row], judge_logits: Tensor | None = None):
        self.run, self.rows, self.judge_logits = run, rows, judge_logits
        device = run.device
        self.slots = torch.tensor([r.slot for r in rows], dtype=torch.long, device=device)
        lengths = run.end.lengths[self.slots]
        width = int(lengths.max())
        hidden = run.hidden[self.slots, :width] if run.hidden is not None else None
        self.draw = StepDraw(run.tokens[self.slots, :width], lengths, run.logprobs[self.slots, :width],
                             run.entropy[self.slots, :width], hidden, run.end.eos[self.slots])
        self.budget = run.end.budget[self.slots]
        self.steps_done = torch.tensor([len(r.spans) for r in rows], dtype=torch.long, device=device)
        self.target_steps = torch.tensor([r.target_steps for r in rows], dtype=torch.long, device=device)
        self.last_by_target = torch.tensor([r.last_by_target for r in rows], dtype=torch.bool, device=device)
        self.row_keys = [r.key for r in rows]

    def judge(self, suffix_ids) -> Tensor:
        if self.judge_logits is None or tuple(suffix_ids) != tuple(self.run.policy.judge_suffix):
            raise ValueError("policy: under schedule='async' a policy judges only with its judge_suffix, which the "
                             "target's batched forward has already run")
        return self.judge_logits

    def contexts(self) -> list[list[int]]:
        return [r.prompt + r.tokens for r in self.rows]

    def steps(self) -> list[list[int]]:
        return [row[:n] for row, n in zip(self.draw.tokens.tolist(), self.draw.lengths.tolist())]

    def target_steps_sample(self, count: int, generator: torch.Generator,
                            sampling: SamplingConfig = ORACLE_SAMPLING) -> list[list[list[int]]]:
        run = self.run
        home = run.states["target"]
        part = home.take_rows(self.slots)  # a view: each sample's round keeps none of its slots
        everyone = torch.ones(len(self.rows), dtype=torch.bool, device=run.device)
        samples = [[] for _ in self.rows]
        try:
            with run.timer("target"):
                for _ in range(count):
                    draw = part.generate_step(everyone, self.budget, sampling, generator, run.spec.delimiter,
                                              run.limits.eos)
                    part.close_round(torch.zeros_like(draw.lengths), part.pending, part.pending_count)
                    for b, (row, n) in enumerate(zip(draw.tokens.tolist(), draw.lengths.tolist())):
                        samples[b].append(row[:n])
        finally:
            home.forwards += part.forwards
            part.close()
        return samples


class RowScheduler:
    """Runs `StepSpeculator.generate(schedule='async')`: `batch` slots, each row advancing on its own."""

    def __init__(self, spec, prompts: list[list[int]], keys: list[int], gens, limits: Limits, batch: int,
                 refill: bool, timer):
        self.spec, self.policy, self.device = spec, spec.policy, spec.device
        self.prompts, self.keys, self.limits, self.batch, self.refill, self.timer = (
            prompts, keys, limits, batch, refill, timer)
        self.draft_gens, self.target_gens = gens
        uses_draft = self.policy.proposes or spec.inner_speculation is not None
        self.models = [name for name, used in (("draft", uses_draft), ("target", self.policy.uses_target)) if used]
        self.inner = spec.inner_speculation if len(self.models) == 2 else None
        self.regenerate = SPECULATING if self.inner else REGENERATING
        self.checked = self.policy.proposes and self.policy.uses_target
        self.eos_set = set(limits.eos.tolist())
        self.waiting = list(range(len(prompts)))
        self.slots: list[Row] = []
        self.states: dict[str, ModelState] = {}
        n = len(prompts)
        self.row_forwards = {name: torch.zeros(n, dtype=torch.long, device=self.device) for name in self.models}
        self.forwards = dict.fromkeys(self.models, 0)
        self.prefill_forwards = dict.fromkeys(self.models, 0)
        self.extras = ReasoningExtras()
        self.records = RowRecords.empty(n)
        self.width = spec.delimiter.max_step_tokens + (self.inner or 0) + 1  # inner rounds may run past the end
        self.hidden: Tensor | None = None  # [S, width, H] the draft's features per step token (routers)

    # ------------------------------------------------------------------ the loop
    def run(self) -> tuple[RowRecords, GenerationStats]:
        try:
            while self.slots or self.waiting:
                if not self.slots:
                    self._admit(self._next(self.batch))
                ended = self._draft_pass()
                if ended and self.policy.judges:
                    for row in ended:
                        row.phase = JUDGING
                elif ended:
                    with self.timer("policy"):
                        scores, accept = self.policy.decide(_View(self, ended))
                    self._decided(ended, scores, accept, judged=False)
                self._target_pass()
                self._speculate_pass()
                self._retire()
        finally:
            for state in self.states.values():
                state.close()
        return self.records, self._stats()

    def _next(self, count: int) -> list[int]:
        taken, self.waiting = self.waiting[:count], self.waiting[count:]
        return taken

    # ------------------------------------------------------------------ rows joining and leaving
    def _owner(self, name: str):
        if name == "draft":
            return ModelDrafter(self.spec.draft, features=self.policy.needs_features)
        return HFCausalLMTarget(self.spec.target)

    def _admit(self, indices: list[int], slots: list[int] | None = None) -> None:
        """Prefill prompts `indices` into `slots` (reused slots of finished rows), or as a new batch."""
        ids, mask = left_pad([self.prompts[i] for i in indices])
        origin = torch.tensor(indices, dtype=torch.long, device=self.device)
        with self.timer("prefill"):
            fresh = {name: ModelState.start(self._owner(name), ids.to(self.device), mask.to(self.device))
                     for name in self.models}
        now = time.perf_counter()
        rows = [Row(i, self.prompts[i], self.keys[i], None if self.draft_gens is None else self.draft_gens[i],
                    None if self.target_gens is None else self.target_gens[i], now) for i in indices]
        for name, state in fresh.items():
            self.forwards[name] += state.forwards
            self.prefill_forwards[name] += state.prefill_forwards
            state.forwards = 0
            if slots is None:
                state.origin, state.row_forwards = origin, self.row_forwards[name]
                self.states[name] = state
            else:
                home = self.states[name]
                index = torch.tensor(slots, dtype=torch.long, device=self.device)
                home.put_rows(index, state)
                home.origin = home.origin.clone()
                home.origin[index] = origin
        if slots is None:
            self.slots = rows
            size = len(rows)
            self.tokens = torch.zeros(size, self.width, dtype=torch.long, device=self.device)
            self.logprobs = torch.zeros(size, self.width, dtype=torch.float32, device=self.device)
            self.entropy = torch.zeros_like(self.logprobs)
            self.hidden = None
            self.end = StepEnd(self.spec.delimiter, self.limits.eos, torch.zeros_like(self.tokens[:, 0]))
            slots = list(range(size))
        for row, slot in zip(rows, slots):
            row.slot = slot
            self.slots[slot] = row
        self._begin_step(rows)

    def _retire(self) -> None:
        """Finished rows leave: waiting prompts take their slots (refill), or the batch shrinks."""
        done = [r for r in self.slots if r.phase == DONE]
        if not done:
            return
        for row in done:
            for name in ("tokens", "logprobs", "sources", "spans", "scores", "decisions", "latency"):
                getattr(self.records, name)[row.index] = getattr(row, name)
        free = [r.slot for r in done]
        if self.refill and self.waiting:
            joining = self._next(len(free))
            self._admit(joining, free[:len(joining)])
            free = free[len(joining):]
        if not free:
            return
        if len(free) == len(self.slots):
            self._harvest()
            for state in self.states.values():
                state.close()
            self.states, self.slots = {}, []
            return
        gone = set(free)
        keep = torch.tensor([i for i in range(len(self.slots)) if i not in gone], dtype=torch.long,
                            device=self.device)
        for state in self.states.values():
            state.select_rows(keep)
        self.end.select(keep)
        self.tokens, self.logprobs, self.entropy = self.tokens[keep], self.logprobs[keep], self.entropy[keep]
        self.hidden = self.hidden[keep] if self.hidden is not None else None
        self.slots = [r for r in self.slots if r.slot not in gone]
        for slot, row in enumerate(self.slots):
            row.slot = slot

    # ------------------------------------------------------------------ steps
    def _slots(self, rows: list[Row]) -> Tensor:
        return torch.tensor([r.slot for r in rows], dtype=torch.long, device=self.device)

    def _begin_step(self, rows: list[Row], phase: str | None = None) -> None:
        """Start a step (drafted first when the policy proposes, else the target's) for `rows`."""
        if not rows:
            return
        slots = self._slots(rows)
        budget = [min(self.limits.max_new_tokens - len(r.tokens), self.spec.delimiter.max_step_tokens) for r in rows]
        self.end.restart(slots, torch.tensor(budget, dtype=torch.long, device=self.device))
        self.tokens[slots], self.logprobs[slots], self.entropy[slots] = 0, 0.0, 0.0
        if self.hidden is not None:
            self.hidden[slots] = 0.0
        phase = phase or (DRAFTING if self.policy.proposes else self.regenerate)
        for row in rows:
            row.phase = phase
            if phase == DRAFTING:
                row.score, row.drafted = math.nan, 0

    def _draw(self, logits: Tensor, rows: list[Row], model: str) -> tuple[Tensor, Tensor, Tensor]:
        """Each row's next token from its own generator: (tokens, log-probs, entropies) [b]."""
        bad = nonfinite_rows(logits)
        if bool(bad.any()):
            which = bad.nonzero().flatten().tolist()
            token = int(self.end.lengths[self._slots([rows[i] for i in which])].min())
            raise NonFiniteError(nonfinite_message(self.states[model].owner.model, f"token {token} of a reasoning "
                                                   "step", sorted(rows[i].index for i in which)))
        sampling = self.limits.sampling
        probs = process_logits(logits, sampling)
        gens = self.draft_gens if model == "draft" else self.target_gens
        if not sampling.greedy and gens is not None:
            gens = [r.draft_gen if model == "draft" else r.target_gen for r in rows]
        drawn = probs.argmax(-1) if sampling.greedy else sample(probs, gens)
        logprobs = probs.gather(1, drawn[:, None])[:, 0].clamp_min(1e-45).log()
        entropy = -(probs * probs.clamp_min(1e-45).log()).sum(-1)
        return drawn, logprobs, entropy

    def _write(self, rows: list[Row], drawn: Tensor, logprobs: Tensor, entropy: Tensor,
               hidden: Tensor | None = None) -> list[Row]:
        """Append one drawn token to each row's step; returns the rows whose step has ended."""
        slots = self._slots(rows)
        at = self.end.lengths[slots]
        self.tokens[slots, at], self.logprobs[slots, at], self.entropy[slots, at] = drawn, logprobs, entropy
        if hidden is not None:
            if self.hidden is None:
                self.hidden = hidden.new_zeros(len(self.slots), self.width, hidden.shape[-1])
            self.hidden[slots, at] = hidden
        _, ended = self.end.take(drawn[:, None], torch.ones_like(drawn), slots)
        return [row for row, flag in zip(rows, ended.tolist()) if flag]

    def _draft_pass(self) -> list[Row]:
        """One draft token for every drafting row; returns the rows whose draft step has ended."""
        rows = [r for r in self.slots if r.phase == DRAFTING]
        if not rows:
            return []
        with self.timer("draft"):
            step = _Pass(self.states["draft"], [r.slot for r in rows])
            logits, hidden = step.run()
            drawn, logprobs, entropy = self._draw(logits, rows, "draft")
            step.close(drawn)
            return self._write(rows, drawn, logprobs, entropy, hidden)

    def _target_pass(self) -> None:
        """The target's forwards of an iteration: one for the rows being judged (pending tail, draft step, judge
        suffix), one for the rows regenerating (one token each). Apart, so a regenerating row is not padded to
        the width of a judged step."""
        judged = [r for r in self.slots if r.phase == JUDGING]
        writing = [r for r in self.slots if r.phase == REGENERATING]
        for rows in (judged, writing):
            if rows:
                self._target_forward(rows)

    def _target_forward(self, rows: list[Row]) -> None:
        """One target forward for `rows`: each judged row's step and judge suffix, or one token of a
        regenerating row."""
        judged = [i for i, r in enumerate(rows) if r.phase == JUDGING]
        writing = [i for i, r in enumerate(rows) if r.phase == REGENERATING]
        with self.timer("target"):
            step = _Pass(self.states["target"], [r.slot for r in rows])
            extra, lengths = None, None
            if judged:
                is_judged = torch.zeros(len(rows), dtype=torch.bool, device=self.device)
                is_judged[judged] = True
                lengths = torch.where(is_judged, self.end.lengths[step.slots], 0)
                suffix = torch.tensor(self.policy.judge_suffix, dtype=torch.long, device=self.device)
                tokens, valid = pack([(self.tokens[step.slots, :int(lengths.max())], lengths),
                                      (suffix.expand(len(rows), -1), is_judged.long() * suffix.numel())])
                extra = (tokens, valid.sum(1))
            logits, _ = step.run(extra)
            tail, keep = torch.zeros_like(step.count), step.count.clone()
            if writing:
                drawn, logprobs, entropy = self._draw(logits[writing], [rows[i] for i in writing], "target")
                tail[writing] = drawn
            if judged:
                judged_rows = [rows[i] for i in judged]
                with self.timer("policy"):
                    scores, accept = self.policy.decide(_View(self, judged_rows, logits[judged]))
                accept = accept.bool().to(self.device)
                index = torch.tensor(judged, dtype=torch.long, device=self.device)
                count, n = step.count[index], lengths[index]
                last_draft = self.tokens[step.slots[index], n - 1]
                last_context = step.state.last_pending()[step.at[index], 0]
                keep[index] = torch.where(accept, count + n - 1, count - 1)
                tail[index] = torch.where(accept, last_draft, last_context)
                self.extras.judge_forwards += 1
                self.extras.judge_tokens += int((count + n).sum()) + len(judged) * len(self.policy.judge_suffix)
            step.close(tail, keep)
        if judged:
            self._decided(judged_rows, scores, accept, judged=True)
        if writing:
            ended = self._write([rows[i] for i in writing], drawn, logprobs, entropy)
            if ended and "draft" in self.states:  # the draft reads the target's step at its next step
                self._append("draft", ended)
            self._finish(ended, TARGET)

    def _speculate_pass(self) -> None:
        """One exact token-level speculation round (core `SpeculativeGenerator.step`) for the rows whose
        regenerated step the target writes with the draft's help."""
        rows = [r for r in self.slots if r.phase == SPECULATING]
        if not rows:
            return
        target, draft = self.states["target"], self.states["draft"]
        slots = self._slots(rows)
        everyone = len(rows) == target.batch
        with self.timer("target"):
            part_target = target if everyone else target.take_rows(slots)
            part_draft = draft if everyone else draft.take_rows(slots)
            before = part_draft.owner.draft_forwards
            generator = open_round(part_target, part_draft, self.inner, self.timer)
            gens = None if self.target_gens is None else [r.target_gen for r in rows]
            ended = speculate_round(generator, (part_target, part_draft), slots, self.end, self.limits.sampling,
                                    gens, self.tokens, self.logprobs)
            close_round(generator, self.timer)
            self.forwards["draft"] += part_draft.owner.draft_forwards - before
            if not everyone:
                target.put_rows(slots, part_target)
                draft.put_rows(slots, part_draft)
                target.forwards += part_target.forwards
        self._finish([r for r, flag in zip(rows, ended.tolist()) if flag], TARGET)

    def _decided(self, rows: list[Row], scores: Tensor, accept: Tensor, judged: bool) -> None:
        """Kept draft steps are written; rejected ones are rewound from the draft and regenerated."""
        for row, score in zip(rows, scores.tolist()):
            row.score = score
        flags = accept.bool().tolist()
        kept = [r for r, flag in zip(rows, flags) if flag]
        rejected = [r for r, flag in zip(rows, flags) if not flag]
        if kept and not judged and "target" in self.states:  # the target reads the kept step lazily
            self._append("target", kept)
        self._finish(kept, DRAFT)
        if rejected:
            draft = self.states["draft"]
            slots = self._slots(rejected)
            lengths = self.end.lengths[slots]
            extra = torch.zeros_like(draft.pending_count)
            last = torch.zeros_like(draft.pending[:, :1])
            extra[slots] = lengths
            last[slots, 0] = torch.tensor([r.last_token() for r in rejected], dtype=torch.long, device=self.device)
            draft.drop_last(extra, last)  # back to the context before the step
            for row, n in zip(rejected, lengths.tolist()):
                row.drafted = n
            self._begin_step(rejected, self.regenerate)

    def _append(self, name: str, rows: list[Row]) -> None:
        """Queue each row's finished step as pending tokens of model `name`."""
        state = self.states[name]
        slots = self._slots(rows)
        counts = torch.zeros_like(state.pending_count)
        counts[slots] = self.end.lengths[slots]
        state.append_pending(self.tokens[:, :int(counts.max())], counts)

    def _finish(self, rows: list[Row], source: int) -> None:
        """Record the step each row has finished; rows that are done leave at `_retire`, the others go on."""
        if not rows:
            return
        slots = self._slots(rows)
        lengths = self.end.lengths[slots].tolist()
        tokens, logprobs = self.tokens[slots].tolist(), self.logprobs[slots].tolist()
        extras, limits, now, going = self.extras, self.limits, time.perf_counter(), []
        for row, n, row_tokens, row_logprobs in zip(rows, lengths, tokens, logprobs):
            step, start = row_tokens[:n], len(row.tokens)
            row.tokens += step
            row.logprobs += row_logprobs[:n]
            row.sources += [source] * n
            row.spans.append((start, start + n))
            row.scores.append(row.score)
            row.decisions.append(source == DRAFT if self.checked else None)
            extras.steps += 1
            extras.checked_steps += int(self.checked)
            if source == DRAFT:
                extras.draft_steps += 1
                extras.draft_tokens += n
            else:
                extras.target_steps += 1
                extras.discarded_draft_tokens += row.drafted
            row.target_steps += int(source == TARGET)
            row.last_by_target = source == TARGET
            done = bool(set(step) & self.eos_set) or start + n >= limits.max_new_tokens
            if done or (limits.max_steps is not None and len(row.spans) >= limits.max_steps):
                row.phase, row.latency = DONE, now - row.joined
            else:
                going.append(row)
        self._begin_step(going)

    # ------------------------------------------------------------------ counts
    def _harvest(self) -> None:
        for name, state in self.states.items():
            self.forwards[name] += state.forwards
            state.forwards = 0

    def _stats(self) -> GenerationStats:
        self._harvest()
        new_tokens = [len(t) for t in self.records.tokens]
        target = "target" in self.models
        return GenerationStats(
            target_forwards=self.forwards["target"] - self.prefill_forwards["target"] if target else 0,
            draft_forwards=self.forwards.get("draft", 0), new_tokens=sum(new_tokens), wall_time_s=0.0,
            new_tokens_per_row=new_tokens,
            target_forwards_per_row=self.row_forwards["target"].tolist() if target else [0] * len(new_tokens),
            reasoning=self.extras)
