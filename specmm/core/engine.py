"""SpeculativeGenerator: the draft -> verify -> accept -> commit loop over a ragged batch.

The prompt minus its last token is prefilled; the last prompt token is the first round's root, so every
generated token comes out of a verify forward and `mean_accepted` is exactly tokens per target forward.
Rows accept different numbers of tokens (a length per row, no crop to the shortest row); rows that hit
EOS or `max_new_tokens` leave the batch and stop costing compute.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from specmm.core.acceptance import EXACT, AcceptanceRule, AcceptResult, accept_greedy, accept_sampled
from specmm.core.drafters import Drafter, accepted_tokens
from specmm.core.limits import check_generation_positions, check_tree_vocab
from specmm.core.processors import History, TreeLogitsProcessor, resolve_special_tokens
from specmm.core.stats import GenerationStats
from specmm.core.sampling import GREEDY, Generators, SamplingConfig, process_logits, select_generators
from specmm.core.target import FEATURES, Target, as_target
from specmm.core.tree import TreeSpec, limit_depth

logger = logging.getLogger(__name__)


@dataclass
class GenerationOutput:
    sequences: Tensor  # [B, L + n] prompt as given, then new tokens, right-padded with pad_token_id
    stats: GenerationStats


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class SpeculativeGenerator:
    """Speculative decoding of a target with a drafter, over batches, chains or trees."""

    def __init__(self, target, drafter: Drafter, tree: TreeSpec | None = None,
                 acceptance: str | AcceptanceRule = "exact"):
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

    def _check_inputs(self, input_ids, attention_mask, max_new_tokens, sampling, eos_token_id, pad_token_id,
                      generator, streamer) -> tuple[Tensor, Tensor, list[int]]:
        if not isinstance(input_ids, Tensor) or input_ids.dim() != 2:
            raise ValueError("input_ids: expected a [batch, length] LongTensor")
        if input_ids.numel() == 0:
            raise ValueError(f"input_ids: empty input of shape {tuple(input_ids.shape)}")
        if input_ids.dtype not in (torch.long, torch.int):
            raise ValueError(f"input_ids: expected integer token ids, got {input_ids.dtype}")
        vocab = self.target.vocab_size
        if int(input_ids.min()) < 0 or int(input_ids.max()) >= vocab:
            raise ValueError(f"input_ids: token ids must be in [0, {vocab})")
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if not isinstance(attention_mask, Tensor) or attention_mask.shape != input_ids.shape:
            shape = tuple(attention_mask.shape) if isinstance(attention_mask, Tensor) else type(attention_mask)
            raise ValueError(f"attention_mask: shape {shape} does not match input_ids {tuple(input_ids.shape)}")
        if not bool(attention_mask[:, -1].bool().all()):
            raise ValueError("attention_mask: the last column must be all ones (pad prompts on the left)")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens: expected an integer >= 1, got {max_new_tokens!r}")
        if not isinstance(sampling, SamplingConfig):
            raise ValueError(f"sampling: expected a SamplingConfig, got {type(sampling).__name__}")
        if self.greedy_only and not sampling.greedy:
            raise ValueError("acceptance: 'greedy' needs sampling temperature 0; use 'exact' to sample")
        eos = [] if eos_token_id is None else ([eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id))
        if any(not isinstance(e, int) or not 0 <= e < vocab for e in eos):
            raise ValueError(f"eos_token_id: expected ids in [0, {vocab}), got {eos_token_id!r}")
        # stock checkpoints (specmm.core.limits): pad id in the vocabulary, positions the model gives exactly
        if pad_token_id is not None and (isinstance(pad_token_id, bool) or not isinstance(pad_token_id, int)
                                         or not 0 <= pad_token_id < vocab):
            raise ValueError(f"pad_token_id: expected an id in [0, {vocab}) (argument or the model's "
                             f"generation_config), got {pad_token_id!r}")
        check_generation_positions(getattr(self.target, "model", None), attention_mask, max_new_tokens)
        if generator is not None and not isinstance(generator, torch.Generator):
            if len(generator) != input_ids.shape[0]:
                raise ValueError(f"generator: expected one generator or {input_ids.shape[0]} (one per row), "
                                 f"got {len(generator)}")
        if streamer is not None and not (hasattr(streamer, "put") and hasattr(streamer, "end")):
            raise ValueError("streamer: expected an object with put() and end() (like transformers' TextStreamer)")
        device = self.target.device
        return input_ids.to(device).long(), attention_mask.to(device).long(), eos

    @torch.no_grad()
    def generate(self, input_ids: Tensor, attention_mask: Tensor | None = None, max_new_tokens: int = 64,
                 sampling: SamplingConfig = GREEDY, eos_token_id: int | Sequence[int] | None = None,
                 pad_token_id: int | None = None, generator: Generators = None, streamer=None,
                 **model_inputs) -> GenerationOutput:
        """Generate up to `max_new_tokens` per row from left-padded `input_ids` [B, L].

        `model_inputs` (e.g. `pixel_values`) go to the target's prefill, for targets that take them.
        `eos_token_id` / `pad_token_id` default to the target model's `generation_config` (`eos_token_id=[]`:
        no EOS even when it sets one), whose logits processors apply at every tree node (or are refused
        before any work; see `specmm.core.processors`). Sampling warpers come from `sampling` alone.
        """
        model = getattr(self.target, "model", None)
        eos_token_id, pad_token_id = resolve_special_tokens(model, eos_token_id, pad_token_id)
        input_ids, attention_mask, eos = self._check_inputs(
            input_ids, attention_mask, max_new_tokens, sampling, eos_token_id, pad_token_id, generator, streamer)
        processor = TreeLogitsProcessor.from_model(model, eos)  # None when the generation config sets none
        self.target.check_model_inputs(model_inputs)
        device = self.target.device
        pad = pad_token_id if pad_token_id is not None else (eos[0] if eos else 0)
        batch = input_ids.shape[0]
        _synchronize(device)
        started = time.perf_counter()
        _stream_prompt(streamer, input_ids, attention_mask)

        target, drafter = self.target, self.drafter
        target.start(batch, needs=drafter.needs)
        try:
            out, counts, rounds, histogram, stats = self._loop(
                input_ids, attention_mask, max_new_tokens, sampling, eos, pad, generator, streamer, model_inputs,
                processor)
        finally:
            target.close()  # removes any feature hook from the user's model
        if streamer is not None:
            streamer.end()
        _synchronize(device)
        stats.wall_time_s = time.perf_counter() - started
        stats.draft_forwards = drafter.draft_forwards
        stats.new_tokens_per_row = counts.tolist()
        stats.target_forwards_per_row = rounds.tolist()
        stats.new_tokens = sum(stats.new_tokens_per_row)
        stats.accepted_histogram = histogram.tolist()
        width = int(counts.max())
        return GenerationOutput(sequences=torch.cat([input_ids, out[:, :width]], 1), stats=stats)

    def _loop(self, input_ids, attention_mask, max_new_tokens, sampling, eos, pad, generator, streamer, model_inputs,
              processor: TreeLogitsProcessor | None = None):
        """Prefill, then draft -> verify -> accept -> commit until every row is done."""
        target, drafter, device, batch = self.target, self.drafter, self.target.device, input_ids.shape[0]
        prefill = target.prefill(input_ids[:, :-1], attention_mask[:, :-1], **model_inputs)
        drafter.start(input_ids, attention_mask, prefill)
        eos_ids = torch.tensor(eos, dtype=torch.long, device=device)

        # spare columns so a round's tokens can always be written past a row's count (then overwritten or cut)
        out = torch.full((batch, max_new_tokens + self.tree.depth + 1), pad, dtype=torch.long, device=device)
        counts = torch.zeros(batch, dtype=torch.long, device=device)  # new tokens per original row
        rounds = torch.zeros(batch, dtype=torch.long, device=device)
        active = torch.arange(batch, device=device)  # original row of each live row
        roots, generators = input_ids[:, -1], generator
        stats = GenerationStats()
        histogram = torch.zeros(self.tree.depth + 1, dtype=torch.long, device=device)
        while active.numel():
            tree = drafter.draft(roots, self.tree, sampling, generators)
            tree = limit_depth(tree, max_new_tokens - counts[active] - 1)  # no node past a row's token budget
            verified = target.verify(tree)
            stats.target_forwards += 1
            logits = verified.logits  # [b, T, V]
            if processor is not None:  # generation_config's processors, each node after its own sequence
                logits = processor(logits, tree, History.of(input_ids, attention_mask, out, counts, active))
            result = self._accept(tree, logits, sampling, generators)
            histogram += torch.bincount(result.num_accepted, minlength=histogram.numel())[: histogram.numel()]
            new = accepted_tokens(tree, result)  # [b, D+1]
            take, finished = self._truncate(new, result, max_new_tokens - counts[active], eos_ids)
            steps = torch.arange(new.shape[1], device=device)
            out[active[:, None], counts[active][:, None] + steps] = torch.where(steps < take[:, None], new, pad)
            counts[active] += take
            rounds[active] += 1
            _stream_round(streamer, batch, active, new, take)

            target.commit(result.path, result.num_accepted + 1)
            path_features = None
            if FEATURES in drafter.needs:
                index = result.path[:, :, None].expand(*result.path.shape, verified.features.shape[-1])
                path_features = verified.features.gather(1, index)
            drafter.update(tree, result, path_features)
            roots = result.next_token
            if bool(finished.any()):
                keep = (~finished).nonzero().flatten()
                target.select_rows(keep)
                drafter.select_rows(keep)
                roots = roots[keep]
                generators = select_generators(generators, keep.tolist())
                active = active[keep]
        return out, counts, rounds, histogram, stats

    def _accept(self, tree, logits: Tensor, sampling: SamplingConfig, generators: Generators) -> AcceptResult:
        if sampling.greedy:
            return accept_greedy(tree, logits, self.rule)
        return accept_sampled(tree, process_logits(logits, sampling), self.rule, generators)

    @staticmethod
    def _truncate(new: Tensor, result: AcceptResult, remaining: Tensor, eos_ids: Tensor) -> tuple[Tensor, Tensor]:
        """How many of each row's new tokens to keep ([b]) and which rows are done ([b] bool)."""
        take = torch.minimum(result.num_accepted + 1, remaining)
        done = take >= remaining
        if eos_ids.numel():
            steps = torch.arange(new.shape[1], device=new.device)
            is_eos = torch.isin(new, eos_ids) & (steps[None, :] < take[:, None])
            hit = is_eos.any(1)
            take = torch.where(hit, is_eos.to(torch.uint8).argmax(1) + 1, take)
            done = done | hit
        return take, done


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
