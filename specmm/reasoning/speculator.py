"""StepSpeculator: step-level speculation over a ragged batch (SpecReason, Arbitrage, RSD-style, controls).

Each iteration every live row writes one step: the draft proposes it, the policy keeps it or the target
regenerates it, and the model that did not write the step gets it appended from token ids (lazily, as
the pending tail its next round starts with). A rejected step or judge prompt is dropped from the cache
by closing the round without keeping it, never by re-encoding text. The caches belong to the core's
adapters (`HFCausalLMTarget`, `ModelDrafter`); with `inner_speculation` the target regenerates a step
through the core's own round (`specmm.reasoning.inner`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from specmm.core.drafters import ModelDrafter
from specmm.core.limits import check_decoder_cache
from specmm.core.sampling import GREEDY, SamplingConfig
from specmm.core.stats import GenerationStats, ReasoningExtras
from specmm.core.target import HFCausalLMTarget, attention_backend, model_device, output_vocab_size
from specmm.reasoning.inner import speculate_step
from specmm.reasoning.policies import ORACLE_SAMPLING, StepPolicy, TargetOnly
from specmm.reasoning.rollout import DRAFT, TARGET, RolloutBatch, RowRecords, assemble
from specmm.reasoning.schedule import Limits, RowScheduler
from specmm.reasoning.state import ModelState, StepDraw, left_pad, pack
from specmm.reasoning.steps import StepDelimiter
from specmm.reasoning.timing import PhaseTimer

SCHEDULES = ("lockstep", "async")


def _choose(cond: Tensor, first: tuple[Tensor, Tensor], second: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    """Per row, (tokens, count) from `first` where cond else from `second` (tokens left-aligned)."""
    width = max(first[0].shape[1], second[0].shape[1])
    a = nn.functional.pad(first[0], (0, width - first[0].shape[1]))
    b = nn.functional.pad(second[0], (0, width - second[0].shape[1]))
    return torch.where(cond[:, None], a, b), torch.where(cond, first[1], second[1])




class _View:
    """The StepView a policy sees for the current step of the live rows."""

    def __init__(self, run: _Run, draw: StepDraw, budget: Tensor):
        self.run, self.draw, self.budget = run, draw, budget
        self.steps_done, self.target_steps = run.steps_done, run.target_steps
        self.last_by_target = run.last_by_target
        self.row_keys = [run.keys[b] for b in run.live]

    def judge(self, suffix_ids) -> Tensor:
        target, draw = self.run.target, self.draw
        batch = target.batch
        suffix = torch.tensor(suffix_ids, dtype=torch.long, device=target.device).expand(batch, len(suffix_ids))
        full = torch.full((batch,), len(suffix_ids), dtype=torch.long, device=target.device)
        tokens, valid = pack([(target.pending, target.pending_count), (draw.tokens, draw.lengths), (suffix, full)])
        with self.run.timer("target"):
            out = target.run(tokens, valid)
        self.run.extras.judge_forwards += 1
        self.run.extras.judge_tokens += int(valid.sum())
        last = target.pending_count + draw.lengths + len(suffix_ids) - 1
        return out.logits[torch.arange(batch, device=target.device), last]

    def contexts(self) -> list[list[int]]:
        return [self.run.prompts[b] + self.run.tokens[b] for b in self.run.live]

    def steps(self) -> list[list[int]]:
        return [row[:n] for row, n in zip(self.draw.tokens.tolist(), self.draw.lengths.tolist())]

    def target_steps_sample(self, count: int, generator: torch.Generator,
                            sampling: SamplingConfig = ORACLE_SAMPLING) -> list[list[list[int]]]:
        samples = [[] for _ in range(self.run.target.batch)]
        with self.run.timer("target"):
            self._sample(count, samples, budget=self.budget, sampling=sampling, generator=generator)
        return samples

    def _sample(self, count, samples, budget, sampling, generator) -> None:
        run, target = self.run, self.run.target
        everyone = torch.ones(target.batch, dtype=torch.bool, device=target.device)
        for _ in range(count):
            draw = target.generate_step(everyone, budget, sampling, generator, run.delimiter, run.eos)
            target.close_round(torch.zeros_like(draw.lengths), target.pending, target.pending_count)
            for b, (row, n) in enumerate(zip(draw.tokens.tolist(), draw.lengths.tolist())):
                samples[b].append(row[:n])


class _Run:
    """Per-generation state: views of both models' caches (owned by the core's `HFCausalLMTarget` and
    `ModelDrafter`), the live rows and what each row has produced."""

    def __init__(self, spec: StepSpeculator, prompts: list[list[int]], prompt_ids: Tensor, prompt_mask: Tensor,
                 eos: Tensor, keys: list[int], timer: PhaseTimer):
        self.prompts, self.eos, self.delimiter, self.keys, self.timer = prompts, eos, spec.delimiter, keys, timer
        self.joined = time.perf_counter()
        batch, device = len(prompts), spec.device
        ids, mask = prompt_ids.to(device), prompt_mask.to(device)  # [B, L] left-padded
        policy = spec.policy
        uses_draft = policy.proposes or spec.inner_speculation is not None
        self.draft = self.target = None
        if uses_draft:
            self.draft = ModelState.start(ModelDrafter(spec.draft, features=policy.needs_features), ids, mask)
        if policy.uses_target:
            self.target = ModelState.start(HFCausalLMTarget(spec.target), ids, mask)
        self.live = list(range(batch))  # original row of each live row
        self.used = torch.zeros(batch, dtype=torch.long, device=device)
        self.steps_done = torch.zeros(batch, dtype=torch.long, device=device)
        self.target_steps = torch.zeros(batch, dtype=torch.long, device=device)
        self.last_by_target = torch.zeros(batch, dtype=torch.bool, device=device)
        self.tokens = [[] for _ in range(batch)]
        self.logprobs = [[] for _ in range(batch)]
        self.sources = [[] for _ in range(batch)]
        self.spans = [[] for _ in range(batch)]
        self.scores = [[] for _ in range(batch)]
        self.decisions = [[] for _ in range(batch)]
        self.latency = [0.0] * batch
        self.extras = ReasoningExtras()

    def select(self, keep: list[int], draft_gens, target_gens):
        index = torch.tensor(keep, dtype=torch.long, device=self.used.device)
        for state in (self.draft, self.target):
            if state is not None:
                state.select_rows(index)
        self.live = [self.live[i] for i in keep]
        self.used, self.steps_done = self.used[index], self.steps_done[index]
        self.target_steps, self.last_by_target = self.target_steps[index], self.last_by_target[index]
        def pick(g):
            return g if g is None or isinstance(g, torch.Generator) else [g[i] for i in keep]
        return pick(draft_gens), pick(target_gens)


def _stats(run: _Run, wall_time_s: float) -> GenerationStats:
    """The run's counts: every target call is a target forward (generation, judging, inner speculation)."""
    new_tokens = [len(tokens) for tokens in run.tokens]
    batch = len(new_tokens)
    target, draft = run.target, run.draft
    return GenerationStats(
        target_forwards=target.forwards - target.prefill_forwards if target else 0,
        draft_forwards=draft.forwards if draft else 0,
        new_tokens=sum(new_tokens), wall_time_s=wall_time_s, new_tokens_per_row=new_tokens,
        target_forwards_per_row=target.row_forwards.tolist() if target else [0] * batch, reasoning=run.extras)


class StepSpeculator:
    """Step-level speculation of `target` with a smaller `draft` of the same vocabulary, under a policy."""

    def __init__(self, target: nn.Module, draft: nn.Module | None, tokenizer, policy: StepPolicy | None = None, *,
                 delimiter: str | Sequence[int] = "\n\n", max_step_tokens: int = 256, draft_tokenizer=None,
                 inner_speculation: int | None = None):
        policy = policy if policy is not None else TargetOnly()
        if not isinstance(policy, StepPolicy):
            raise ValueError(f"policy: expected a specmm.reasoning StepPolicy, got {type(policy).__name__}")  # noqa: TRY004
        if inner_speculation is not None and (isinstance(inner_speculation, bool) or not isinstance(
                inner_speculation, int) or inner_speculation < 1):
            raise ValueError(f"inner_speculation: expected None or an integer >= 1, got {inner_speculation!r}")
        self.inner_speculation = inner_speculation
        for name, model in (("target", target), ("draft", draft)):
            if model is None and (name == "target" or policy.proposes or inner_speculation):
                raise ValueError(f"{name}: policy {policy.name} needs a {name} model")
            if model is not None:
                if not hasattr(model, "get_output_embeddings") or model.get_output_embeddings() is None:
                    raise ValueError(f"{name}: {type(model).__name__} has no language-model head")
                check_decoder_cache(model, name)
                attention_backend(model)
        self.vocab_size = output_vocab_size(target)
        if draft is not None and output_vocab_size(draft) != self.vocab_size:
            raise ValueError(f"draft: vocabulary size {output_vocab_size(draft)} does not match the target's "
                             f"{self.vocab_size}")
        if draft is not None and model_device(draft) != model_device(target):
            raise ValueError(f"draft: on {model_device(draft)} but the target is on {model_device(target)}")
        if tokenizer is None or not hasattr(tokenizer, "encode"):
            raise ValueError("tokenizer: expected a HF tokenizer shared by target and draft")
        if len(tokenizer) > self.vocab_size:
            raise ValueError(f"tokenizer: {len(tokenizer)} tokens but the models have {self.vocab_size} logits")
        if draft_tokenizer is not None and draft_tokenizer.get_vocab() != tokenizer.get_vocab():
            raise ValueError("draft_tokenizer: its vocabulary differs from the target tokenizer's; step speculation "
                             "exchanges token ids, so both models must share one vocabulary")
        self.target, self.draft, self.tokenizer, self.policy = target, draft, tokenizer, policy
        self.device = model_device(target)
        self.delimiter = StepDelimiter(delimiter, tokenizer, max_step_tokens)
        self.draft_hidden_size = draft.config.get_text_config().hidden_size if draft is not None else 0
        policy.bind(self)

    def _prompts(self, prompts, attention_mask) -> tuple[list[list[int]], Tensor, Tensor]:
        if isinstance(prompts, Tensor):
            if prompts.dim() != 2 or prompts.dtype not in (torch.long, torch.int):
                raise ValueError("prompts: expected a [batch, length] tensor of token ids")
            mask = torch.ones_like(prompts) if attention_mask is None else attention_mask
            if mask.shape != prompts.shape:
                raise ValueError(f"attention_mask: shape {tuple(mask.shape)} does not match {tuple(prompts.shape)}")
            rows = [row[m.bool()].tolist() for row, m in zip(prompts, mask)]
        elif isinstance(prompts, (list, tuple)) and prompts and all(isinstance(p, str) for p in prompts):
            rows = [self.tokenizer.encode(p) for p in prompts]
        elif isinstance(prompts, (list, tuple)) and prompts and all(isinstance(p, (list, tuple)) for p in prompts):
            rows = [list(map(int, p)) for p in prompts]
        else:
            raise ValueError("prompts: expected a non-empty list of strings or of token-id lists, or a tensor")
        if any(len(r) == 0 for r in rows):
            raise ValueError("prompts: every prompt needs at least one token")
        if any(min(r) < 0 or max(r) >= self.vocab_size for r in rows):
            raise ValueError(f"prompts: token ids must be in [0, {self.vocab_size})")
        return (rows, *left_pad(rows))

    def _generators(self, seed, batch: int):
        if seed is None:
            return None, None
        seeds = self._seeds(seed, batch)
        def make(s):
            return torch.Generator(self.device).manual_seed(s)
        return [make(2 * s + 1) for s in seeds], [make(2 * s) for s in seeds]

    @staticmethod
    def _seeds(seed, batch: int) -> list[int]:
        if isinstance(seed, int) and not isinstance(seed, bool):
            seeds = [seed + b for b in range(batch)]
        else:
            seeds = list(seed) if isinstance(seed, (list, tuple, range)) else []
        if len(seeds) != batch or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
            raise ValueError(f"seed: expected an int or {batch} ints (one per row), got {seed!r}")
        return seeds

    @torch.no_grad()
    def generate(self, prompts, max_new_tokens: int = 1024, sampling: SamplingConfig = GREEDY, *,
                 attention_mask: Tensor | None = None, eos_token_id: int | Sequence[int] | None = None,
                 pad_token_id: int | None = None, max_steps: int | None = None,
                 seed: int | Sequence[int] | None = None, schedule: str = "lockstep", batch_size: int | None = None,
                 refill: bool = False) -> RolloutBatch:
        """Reason on `prompts` (strings, token-id lists, or a left-padded tensor) until EOS, `max_new_tokens`
        or `max_steps` per row. `seed` gives every row its own draft and target generators (row b: seed + b).

        `schedule`: 'lockstep' advances a batch one step at a time; 'async' lets every row advance on its own
        (`specmm.reasoning.schedule`), with the same results row by row. `batch_size` caps the rows in flight
        (the other prompts wait); with `refill=True` (async only) a waiting prompt takes the place of each
        finished row, otherwise the next batch starts when the last one is done."""
        rows, prompt_ids, prompt_mask = self._prompts(prompts, attention_mask)
        self.policy.bind(self)  # a policy shared by several speculators reads this one's tokenizer and models
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens: expected an integer >= 1, got {max_new_tokens!r}")
        if max_steps is not None and (isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1):
            raise ValueError(f"max_steps: expected an integer >= 1 or None, got {max_steps!r}")
        if not isinstance(sampling, SamplingConfig):
            raise ValueError(f"sampling: expected a SamplingConfig, got {type(sampling).__name__}")  # noqa: TRY004
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule: expected one of {SCHEDULES}, got {schedule!r}")
        if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int)
                                       or batch_size < 1):
            raise ValueError(f"batch_size: expected None or an integer >= 1, got {batch_size!r}")
        if not isinstance(refill, bool):
            raise ValueError(f"refill: expected True or False, got {refill!r}")
        if refill and schedule != "async":
            raise ValueError("refill: waiting prompts join a running batch only with schedule='async'")
        if schedule == "async" and self.policy.judges and self.policy.judge_suffix is None:
            raise ValueError(f"schedule: 'async' runs the judge inside the target's batched forward, and policy "
                             f"{self.policy.name} names no judge_suffix; use schedule='lockstep'")
        eos_token_id = self.tokenizer.eos_token_id if eos_token_id is None else eos_token_id
        eos = [] if eos_token_id is None else ([eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id))
        if any(isinstance(e, bool) or not isinstance(e, int) or not 0 <= e < self.vocab_size for e in eos):
            raise ValueError(f"eos_token_id: expected ids in [0, {self.vocab_size}), got {eos_token_id!r}")
        if pad_token_id is not None and (isinstance(pad_token_id, bool) or not isinstance(pad_token_id, int)
                                         or not 0 <= pad_token_id < self.vocab_size):
            raise ValueError(f"pad_token_id: expected an id in [0, {self.vocab_size}), got {pad_token_id!r}")
        pad = pad_token_id if pad_token_id is not None else (self.tokenizer.pad_token_id or (eos[0] if eos else 0))
        gens = self._generators(seed, len(rows))
        keys = self._seeds(seed, len(rows)) if seed is not None else list(range(len(rows)))
        limits = Limits(max_new_tokens, max_steps, sampling, torch.tensor(eos, dtype=torch.long, device=self.device))
        timer = PhaseTimer(self.device)
        started = time.perf_counter()
        batch = batch_size or len(rows)
        if schedule == "async":
            records, stats = RowScheduler(self, rows, keys, gens, limits, batch, refill, timer).run()
        else:
            records, stats = self._lockstep(rows, keys, gens, limits, batch, timer)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        stats.wall_time_s = time.perf_counter() - started
        return assemble(prompt_ids, prompt_mask, records.tokens, records.logprobs, records.sources, pad,
                        step_spans=records.spans, scores=records.scores, decisions=records.decisions,
                        exact=self.policy.exact, stats=stats, phase_time_s=timer.seconds, latency_s=records.latency)

    def _lockstep(self, rows, keys, gens, limits: Limits, batch: int, timer) -> tuple[RowRecords, GenerationStats]:
        """Batches of `batch` prompts, one after the other, each advancing one step at a time."""
        records, stats = RowRecords.empty(len(rows)), GenerationStats()
        for first in range(0, len(rows), batch):
            part = slice(first, first + batch)
            ids, mask = left_pad(rows[part])
            draft_gens, target_gens = (None if g is None else g[part] for g in gens)
            run = _Run(self, rows[part], ids, mask, limits.eos, keys[part], timer)
            try:
                while run.live:
                    draft_gens, target_gens = self._step(run, limits.max_new_tokens, limits.max_steps,
                                                         limits.sampling, draft_gens, target_gens, timer)
            finally:
                for state in (run.draft, run.target):
                    if state is not None:
                        state.close()
            records.write(first, run)
            stats.add(_stats(run, 0.0))
        return records, stats

    def _step(self, run: _Run, max_new_tokens, max_steps, sampling, draft_gens, target_gens, timer):
        """One step for every live row; returns the generators of the rows still live."""
        policy, draft, target = self.policy, run.draft, run.target
        live = len(run.live)
        ones = torch.ones(live, dtype=torch.long, device=self.device)
        budget = (max_new_tokens - run.used).clamp(max=self.delimiter.max_step_tokens)
        everyone = torch.ones(live, dtype=torch.bool, device=self.device)
        scores = torch.full((live,), math.nan)
        d = t = None
        if policy.proposes:
            with timer("draft"):
                d = draft.generate_step(everyone, budget, sampling, draft_gens, self.delimiter, run.eos)
            with timer("policy"):
                scores, accept = policy.decide(_View(run, d, budget))
            accept = accept.bool().to(self.device)
        else:
            accept = ~everyone
        reject = ~accept
        with timer("other"):
            if d is not None:
                last_d = d.tokens.gather(1, (d.lengths - 1).clamp_min(0)[:, None])  # [B, 1]
                for state, opened in ((draft, True), (target, policy.judges)):
                    if state is None:
                        continue
                    if opened:
                        keep = torch.where(accept, state.pending_count + d.lengths - 1, state.pending_count - 1)
                        tail = torch.where(accept[:, None], last_d, state.last_pending())
                        state.close_round(keep, tail, ones)
                    else:
                        state.append_pending(d.tokens, torch.where(accept, d.lengths, 0))
        if target is not None and bool(reject.any()) and self.inner_speculation and draft is not None:
            with timer("target"):  # exact token-level speculation inside the step; settles both caches
                t = speculate_step(target, draft, reject, budget, self.inner_speculation, sampling, target_gens,
                                   self.delimiter, run.eos, timer)
        elif target is not None and bool(reject.any()):
            with timer("target"):
                t = target.generate_step(reject, budget, sampling, target_gens, self.delimiter, run.eos)
            with timer("other"):
                last_t = t.tokens.gather(1, (t.lengths - 1).clamp_min(0)[:, None])
                tail, count = _choose(reject, (last_t, ones), (target.pending, target.pending_count))
                target.close_round(torch.where(reject, target.pending_count + t.lengths - 1, 0), tail, count)
                if draft is not None:
                    draft.append_pending(t.tokens, torch.where(reject, t.lengths, 0))
        return self._record(run, d, t, accept, scores, max_new_tokens, max_steps, draft_gens, target_gens)

    def _record(self, run, d, t, accept, scores, max_new_tokens, max_steps, draft_gens, target_gens):
        policy, extras = self.policy, run.extras
        accepted, score_list = accept.tolist(), scores.tolist()
        host = {name: (draw.tokens.tolist(), draw.lengths.tolist(), draw.logprobs.tolist())
                for name, draw in (("d", d), ("t", t)) if draw is not None}
        keep, step_lengths = [], []
        for i, b in enumerate(run.live):
            name, source = ("d", DRAFT) if accepted[i] else ("t", TARGET)
            tokens, lengths, logprobs = host[name]
            n = lengths[i]
            step = tokens[i][:n]
            start = len(run.tokens[b])
            run.tokens[b] += step
            run.logprobs[b] += logprobs[i][:n]
            run.sources[b] += [source] * n
            run.spans[b].append((start, start + n))
            run.scores[b].append(score_list[i])
            checked = policy.proposes and policy.uses_target
            run.decisions[b].append(bool(accepted[i]) if checked else None)
            extras.steps += 1
            extras.checked_steps += int(checked)
            if accepted[i]:
                extras.draft_steps += 1
                extras.draft_tokens += n
            else:
                extras.target_steps += 1
                extras.discarded_draft_tokens += host["d"][1][i] if d is not None else 0
            step_lengths.append(n)
            done = bool(set(step) & set(run.eos.tolist())) or start + n >= max_new_tokens
            done = done or (max_steps is not None and len(run.spans[b]) >= max_steps)
            if done:
                run.latency[b] = time.perf_counter() - run.joined
            else:
                keep.append(i)
        n_step = torch.tensor(step_lengths, device=self.device)
        run.used = run.used + n_step
        run.steps_done = run.steps_done + 1
        run.target_steps = run.target_steps + (~accept).long()
        run.last_by_target = ~accept
        if len(keep) < len(run.live):
            return run.select(keep, draft_gens, target_gens)
        return draft_gens, target_gens
