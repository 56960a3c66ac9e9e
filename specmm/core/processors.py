"""What a checkpoint's `generation_config` asks of decoding: EOS/pad ids and logits processors at every tree node.

HF's `generate` runs the logits processors that `_get_logits_processor` builds from the generation config on
a float32 copy of each step's logits, before any sampling warper. Speculative verification sees many
candidate continuations at once, so each tree node is processed as if it were the last token of its own
sequence: the row's committed tokens (prompt as given, left padding included, then the new tokens) followed by
the tree path down to that node. Then argmax (greedy) or `process_logits` (sampling) of the processed logits
gives exactly what `generate` would do after that sequence.

Honoured (in HF's order): repetition_penalty, no_repeat_ngram_size, min_length / min_new_tokens (EOS
suppressed), remove_invalid_values, suppress_tokens, begin_suppress_tokens, renormalize_logits. Every other
setting HF turns into a processor or a different decoding mode is refused with a ValueError naming it (see
`REFUSED`), before any forward. Sampling warpers in the generation config (do_sample, temperature, top_k,
top_p) are not read here: the engine's `sampling` argument decides how tokens are drawn
(`SamplingConfig.from_generation_config` builds one from a checkpoint's settings); min_p, typical_p,
epsilon/eta cutoffs and top_h have no SamplingConfig equivalent and are refused by that constructor.

Drafters that declare `processes_drafts` (model drafters, EAGLE and the VLM heads) draft under the same rules
(`process_paths`, each candidate after its own path), in every tree kind: a draft is exact as long as the
draft distribution handed to acceptance is the one the draft was sampled from, so processing drafts only changes
how often they are accepted (a draft model that knows the target's rules no longer proposes a banned n-gram).
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from specmm.core.tree import DraftTree

logger = logging.getLogger(__name__)


def _is_set(value: Any) -> bool:
    return value is not None


# setting -> (is it active?, why specmm refuses it). Settings HF's `_get_logits_processor` (or the mode choice)
# reads from a GenerationConfig and that no TreeLogitsProcessor rule reproduces.
REFUSED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "guidance_scale": (lambda v: v is not None and v != 1,
                       "classifier-free guidance needs a second, unconditional forward per tree node"),
    "sequence_bias": (_is_set, "multi-token sequence biases are not applied to tree nodes"),
    "bad_words_ids": (_is_set, "bad-word bans are not applied to tree nodes"),
    "encoder_repetition_penalty": (lambda v: v is not None and v != 1.0,
                                   "the prompt-only (encoder) repetition penalty is not applied to tree nodes"),
    "encoder_no_repeat_ngram_size": (lambda v: v is not None and v > 0,
                                     "prompt-only (encoder) n-gram bans are not applied to tree nodes"),
    "forced_bos_token_id": (_is_set, "forcing a first token is not supported"),
    "forced_eos_token_id": (_is_set, "forcing EOS at max_length is not supported"),
    "exponential_decay_length_penalty": (_is_set, "the EOS length penalty is not applied to tree nodes"),
    "watermarking_config": (_is_set, "watermarking changes the target distribution in a way specmm does not apply"),
    "num_beams": (lambda v: v is not None and v > 1, "beam search is not speculative decoding"),
    "penalty_alpha": (lambda v: v is not None and v > 0, "contrastive search is not speculative decoding"),
    "dola_layers": (_is_set, "DoLa contrasts early-exit layers' logits, which tree verification does not compute"),
    "num_return_sequences": (lambda v: v is not None and v > 1,
                             "one sequence is generated per prompt row (repeat the rows for several samples)"),
    "constraints": (_is_set, "constrained beam search is not speculative decoding"),
    "force_words_ids": (_is_set, "constrained beam search is not speculative decoding"),
    "stop_strings": (_is_set, "specmm stops on eos_token_id only (stop strings need the tokenizer)"),
    "max_time": (_is_set, "a wall-clock stop is not supported"),
    "token_healing": (lambda v: bool(v), "token healing rewrites the prompt, which specmm does not do"),
}


def resolve_special_tokens(model: Any, eos_token_id: int | Sequence[int] | None,
                           pad_token_id: int | None) -> tuple[int | list[int] | None, int | None]:
    """(eos, pad): the arguments when given, otherwise the model's `generation_config` values (as `generate`)."""
    config = getattr(model, "generation_config", None)
    if config is None:
        return eos_token_id, pad_token_id
    if eos_token_id is None:
        eos_token_id = config.eos_token_id
        if isinstance(eos_token_id, Tensor):
            eos_token_id = eos_token_id.flatten().tolist()
    if pad_token_id is None:
        pad_token_id = config.pad_token_id
        if isinstance(pad_token_id, Tensor):
            pad_token_id = int(pad_token_id)
    return eos_token_id, pad_token_id

@functools.cache
def hf_skips_left_padding() -> bool:
    """Whether the installed transformers' `generate` keeps left padding out of the repetition penalty (it passes
    `prompt_ignore_length` per row from 5.24 on; 5.17 penalises the pad columns as tokens). specmm follows the
    installed version, so greedy outputs equal its `generate` either way."""
    from transformers.generation.utils import GenerationMixin

    return "prompt_ignore_length" in inspect.getsource(GenerationMixin._get_logits_processor)  # read once


@dataclass
class History:
    """Each row's sequence as `generate` holds it before the current round's tree."""

    tokens: Tensor  # [B, W] prompt as given (left padding kept), then new tokens; junk past `lengths`
    lengths: Tensor  # [B] tokens so far (prompt width + new tokens; the tree's root is the last of them)
    prompt_width: int  # L, the padded prompt width: row b has lengths[b] - L new tokens
    pad_before: Tensor  # [B] left-padding columns of each row (the repetition penalty skips them where HF does)

    @classmethod
    def of(cls, prompt: Tensor, prompt_mask: Tensor, new_tokens: Tensor, counts: Tensor, rows: Tensor) -> History:
        """prompt/prompt_mask [B0, L], new_tokens [B0, N], counts [B0] for every original row; rows [B] live rows."""
        tokens = torch.cat([prompt[rows], new_tokens[rows].to(prompt.dtype)], 1)  # [B, L + N]
        pad_before = (prompt_mask[rows] != 0).int().argmax(1)  # HF: index of the first attended column
        return cls(tokens, prompt.shape[1] + counts[rows], prompt.shape[1], pad_before)


@dataclass
class TreeLogitsProcessor:
    """generation_config's logits processors applied to every node of a draft tree (see the module docstring)."""

    eos_token_ids: Tensor  # [E] ids suppressed by the min-length rules (empty: no EOS, so no min-length rule)
    repetition_penalty: float | None = None
    no_repeat_ngram_size: int = 0
    min_length: int = 0  # total length (padded prompt width + new tokens) below which EOS is suppressed
    min_new_tokens: int = 0  # new tokens below which EOS is suppressed (overrides min_length, as in HF)
    remove_invalid_values: bool = False
    suppress_tokens: Tensor | None = None  # [S]
    begin_suppress_tokens: Tensor | None = None  # [S'] suppressed for the first new token only
    renormalize_logits: bool = False
    skip_left_padding: bool = True  # the repetition penalty skips left padding (`hf_skips_left_padding`)

    @classmethod
    def from_model(cls, model: Any, eos_token_id: Sequence[int] = ()) -> TreeLogitsProcessor | None:
        """The processor a model's `generation_config` asks for; None when it configures none.

        `eos_token_id`: the EOS ids of this generation (HF's min-length rules use them). Raises ValueError,
        naming the setting, for generation-config settings specmm does not reproduce (see `REFUSED`).
        """
        config = getattr(model, "generation_config", None)
        if config is None:
            return None
        for name, (active, why) in REFUSED.items():
            value = getattr(config, name, None)
            if active(value):
                raise ValueError(
                    f"generation_config.{name}={value!r}: not supported by specmm ({why}); unset it on the model "
                    f"(model.generation_config.{name} = None) to decode without it")
        vocab_device = _device(model)
        eos = torch.tensor(list(eos_token_id), dtype=torch.long, device=vocab_device)
        processor = cls(eos_token_ids=eos, skip_left_padding=hf_skips_left_padding())
        penalty = config.repetition_penalty
        if penalty is not None and penalty != 1.0:
            if isinstance(penalty, bool) or not isinstance(penalty, (int, float)) or not penalty > 0:
                raise ValueError(f"generation_config.repetition_penalty: expected a number > 0, got {penalty!r}")
            processor.repetition_penalty = float(penalty)
        ngram = config.no_repeat_ngram_size
        if ngram is not None and ngram > 0:
            if isinstance(ngram, bool) or not isinstance(ngram, int):
                raise ValueError(f"generation_config.no_repeat_ngram_size: expected an integer, got {ngram!r}")
            processor.no_repeat_ngram_size = ngram
        if eos.numel():  # like HF: the min-length rules exist only when there is an EOS to suppress
            processor.min_new_tokens = int(config.min_new_tokens or 0)
            # HF replaces min_length by prompt width + min_new_tokens when both are set: min_new_tokens wins
            processor.min_length = 0 if config.min_new_tokens is not None else int(config.min_length or 0)
        processor.remove_invalid_values = config.remove_invalid_values is True
        processor.renormalize_logits = config.renormalize_logits is True
        for name in ("suppress_tokens", "begin_suppress_tokens"):
            tokens = getattr(config, name)
            if tokens is not None:
                setattr(processor, name, torch.tensor(list(tokens), dtype=torch.long, device=vocab_device))
        if config.do_sample:
            logger.info("generation_config.do_sample=True (temperature=%s, top_k=%s, top_p=%s) is not applied: the "
                        "`sampling` argument decides; SamplingConfig.from_generation_config(model.generation_config) "
                        "follows the checkpoint", config.temperature, config.top_k, config.top_p)
        return processor if processor.active else None

    @property
    def active(self) -> bool:
        return bool(self.repetition_penalty or self.no_repeat_ngram_size or self.min_length or self.min_new_tokens
                    or self.remove_invalid_values or self.renormalize_logits or self.suppress_tokens is not None
                    or self.begin_suppress_tokens is not None)

    @property
    def reads_sequences(self) -> bool:
        """Whether a rule reads each node's whole sequence (the others read only its length)."""
        return self.repetition_penalty is not None or bool(self.no_repeat_ngram_size)

    def __call__(self, logits: Tensor, tree: DraftTree, history: History) -> Tensor:
        """logits [B, T, V] after each node of `tree` -> [B, T, V] float32 processed logits (HF's order)."""
        new_before = (history.lengths - history.prompt_width)[:, None] + tree.depth  # [B, T] new tokens so far
        sequences = lengths = None
        if self.reads_sequences:
            sequences, lengths = node_sequences(tree, history)  # [B, T, S], [B, T]
        return self._process(logits, sequences, lengths, new_before, history)

    def process_paths(self, logits: Tensor, paths: Tensor, history: History) -> Tensor:
        """Draft logits [B, n, V] after n nodes whose tokens below the root are `paths` [B, n, d] -> [B, n, V],
        processed as `__call__` processes a verified node at depth d. Drafting under the rules the target's tokens
        follow gets more drafts accepted (a banned n-gram is never proposed); exactness never depends on it."""
        batch, nodes, depth = paths.shape
        new_before = (history.lengths - history.prompt_width)[:, None].expand(batch, nodes) + depth  # [B, n]
        sequences = lengths = None
        if self.reads_sequences:
            width = history.tokens.shape[1]
            sequences = torch.cat([history.tokens[:, None, :].expand(batch, nodes, width),
                                   history.tokens.new_zeros(batch, nodes, depth)], 2)  # [B, n, W + d]
            columns = history.lengths[:, None, None] + torch.arange(depth, device=paths.device)  # [B, 1, d]
            sequences = sequences.scatter(2, columns.expand(batch, nodes, depth), paths.to(sequences.dtype))
            lengths = history.lengths[:, None].expand(batch, nodes) + depth
        return self._process(logits, sequences, lengths, new_before, history)

    def _process(self, logits: Tensor, sequences: Tensor | None, lengths: Tensor | None, new_before: Tensor,
                 history: History) -> Tensor:
        """logits [B, T, V] after T sequences ([B, T, S] with `lengths` [B, T]; None when no rule reads them) that
        hold `new_before` [B, T] new tokens each -> float32 processed logits, rule by rule in HF's order."""
        scores = logits.float()  # HF processes a float32 copy of the logits
        vocab = scores.shape[-1]
        if self.repetition_penalty is not None:
            start = history.pad_before[:, None, None] if self.skip_left_padding else 0
            seen = token_mask(sequences, start, lengths[:, :, None], vocab)  # [B, T, V]
            penalised = torch.where(scores < 0, scores * self.repetition_penalty, scores / self.repetition_penalty)
            scores = torch.where(seen, penalised, scores)
        if self.no_repeat_ngram_size:
            scores = scores.masked_fill(banned_ngram_tokens(sequences, lengths, self.no_repeat_ngram_size, vocab),
                                        -torch.inf)
        if self.eos_token_ids.numel():
            too_short = new_before < self.min_new_tokens
            too_short |= history.prompt_width + new_before < self.min_length
            is_eos = torch.isin(torch.arange(vocab, device=scores.device), self.eos_token_ids)  # [V]
            scores = scores.masked_fill(too_short[:, :, None] & is_eos, -torch.inf)
        if self.remove_invalid_values:
            finfo = torch.finfo(scores.dtype)
            scores = torch.where(scores != scores, 0.0, scores).clamp(finfo.min, finfo.max)
        if self.suppress_tokens is not None:
            scores = scores.masked_fill(torch.isin(torch.arange(vocab, device=scores.device), self.suppress_tokens),
                                        -torch.inf)
        if self.begin_suppress_tokens is not None:
            first = (new_before == 0)[:, :, None]  # the node whose next token is the first new token
            banned = torch.isin(torch.arange(vocab, device=scores.device), self.begin_suppress_tokens)
            scores = scores.masked_fill(first & banned, -torch.inf)
        if self.renormalize_logits:  # HF puts it after the warpers; a log-softmax leaves their result unchanged
            scores = scores.log_softmax(-1)
        return scores


def _device(model: Any) -> torch.device:
    try:
        return next(model.parameters()).device
    except (AttributeError, StopIteration):
        return torch.device("cpu")


def node_sequences(tree: DraftTree, history: History) -> tuple[Tensor, Tensor]:
    """Each node's full sequence: the row's history, then the tree path below the root down to the node.

    Returns sequences [B, T, W + D + 1] (junk past each node's length) and lengths [B, T]. One scatter per
    tree level (the k-th ancestor of every node at once), no loop over nodes.
    """
    batch, nodes = tree.tokens.shape
    width, levels = history.tokens.shape[1], tree.max_depth
    size = width + levels + 1  # the last column is a dump for the unused scatters
    sequences = torch.zeros(batch, nodes, size, dtype=torch.long, device=tree.tokens.device)
    sequences[:, :, :width] = history.tokens[:, None, :]
    depth = torch.where(tree.valid, tree.depth, 0)  # invalid nodes: only the history (their logits are unused)
    ancestor = torch.arange(nodes, device=tree.tokens.device).expand(batch, nodes)
    tokens = tree.tokens.long()
    for k in range(levels):  # ancestor k levels up sits at position length + depth - k - 1; the root is history
        column = history.lengths[:, None] + depth - k - 1
        column = torch.where(k < depth, column, size - 1)
        sequences.scatter_(2, column[:, :, None], tokens.gather(1, ancestor)[:, :, None])
        ancestor = tree.parents.gather(1, ancestor).clamp_min(0)
    return sequences, history.lengths[:, None] + depth


def token_mask(sequences: Tensor, start: Tensor, end: Tensor, vocab: int) -> Tensor:
    """[B, T, V] bool: which tokens occur in sequences[b, t, start:end] (start/end broadcast to [B, T, 1])."""
    columns = torch.arange(sequences.shape[-1], device=sequences.device)
    inside = (columns >= start) & (columns < end)
    index = torch.where(inside, sequences, vocab)  # tokens outside the range land in a dump column
    mask = torch.zeros(*sequences.shape[:2], vocab + 1, dtype=torch.bool, device=sequences.device)
    return mask.scatter_(2, index, True)[:, :, :vocab]


def banned_ngram_tokens(sequences: Tensor, lengths: Tensor, n: int, vocab: int) -> Tensor:
    """[B, T, V] bool: tokens that would repeat an n-gram of the node's own sequence (HF's NoRepeatNGram rule).

    A token is banned when some earlier n-gram starts with the sequence's last n - 1 tokens.
    """
    if n == 1:  # every token already in the sequence is banned
        zero = torch.zeros_like(lengths)[:, :, None]
        return token_mask(sequences, zero, lengths[:, :, None], vocab)
    size = sequences.shape[-1]
    offsets = torch.arange(n - 1, device=sequences.device)
    suffix_at = (lengths[:, :, None] - (n - 1) + offsets).clamp_min(0)  # [B, T, n-1]
    suffix = sequences.gather(2, suffix_at)
    starts = size - n + 1  # windows whose next token is inside the buffer
    if starts <= 0:  # every sequence is shorter than one n-gram: nothing to ban
        return torch.zeros(*sequences.shape[:2], vocab, dtype=torch.bool, device=sequences.device)
    windows = sequences.unfold(2, n - 1, 1)[:, :, :starts]  # [B, T, J, n-1]
    begins = torch.arange(starts, device=sequences.device)
    match = (windows == suffix[:, :, None, :]).all(-1) & (begins <= lengths[:, :, None] - n)  # [B, T, J]
    following = sequences[:, :, n - 1:]  # [B, T, J] the token after each window
    index = torch.where(match, following, vocab)
    mask = torch.zeros(*sequences.shape[:2], vocab + 1, dtype=torch.bool, device=sequences.device)
    return mask.scatter_(2, index, True)[:, :, :vocab]
