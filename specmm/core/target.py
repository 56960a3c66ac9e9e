"""Targets: the protocol the engine verifies against, and the adapter for stock HF causal LMs.

`ModelRunner` is the one place a stock HF decoder is run over a `RowCache`: every forward passes a custom
4-D attention mask and explicit position ids, so trees, ragged rows and left padding need no patched
modeling code. Drafters built on HF models (`ModelDrafter`, `EagleDrafter`) reuse it.
"""

from __future__ import annotations

import copy
import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, Self, runtime_checkable

import torch
from torch import Tensor, nn

from specmm.core.cache import RowCache
from specmm.core.compiled import StaticPlan
from specmm.core.limits import check_position_scheme, check_decoder_cache, position_limit
from specmm.core.slot_cache import SlotRowCache
from specmm.core.static_cache import StaticRowCache
from specmm.core.tree import DraftTree

TREE_ATTENTION_BACKENDS = ("sdpa", "eager")


def attention_backend(model: nn.Module) -> str:
    """The model's attention implementation, checked to accept custom 4-D masks."""
    backend = getattr(model.config, "_attn_implementation", None) or "eager"
    if backend not in TREE_ATTENTION_BACKENDS:
        raise ValueError(
            f"model: attn_implementation {backend!r} cannot take tree attention masks; load the model with "
            f"attn_implementation='sdpa' (or 'eager')")
    return backend


def model_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


@functools.cache
def _cache_keyword(forward_owner: type) -> str:
    parameters = inspect.signature(forward_owner.forward).parameters
    for name in ("cache", "past_key_values"):
        if name in parameters:
            return name
    from transformers import LlamaModel  # a wrapper passing **kwargs to a stock decoder: the installed name

    return _cache_keyword(LlamaModel)


def cache_keyword(module: nn.Module | type) -> str:
    """The keyword `module.forward` takes its KV cache by: transformers 5.24 renamed `past_key_values` to `cache`
    (the old name warns, and goes in 5.40); earlier 5.x releases take only `past_key_values`. A module taking only
    `**kwargs` gets the name the installed transformers' decoders take. Reads a signature: call it outside
    compiled code and keep the name."""
    return _cache_keyword(module if isinstance(module, type) else type(module))


def output_vocab_size(model: nn.Module) -> int:
    """Width of the logits the model produces (the LM head's rows, which may exceed config.vocab_size)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and getattr(head, "weight", None) is not None:
        return head.weight.shape[0]
    return model.config.get_text_config().vocab_size


def final_norm(model: nn.Module) -> nn.Module | None:
    """The decoder's last norm, whose output is the 'feature' EAGLE-style drafters read."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", model)
    for name in ("norm", "final_layernorm", "norm_f", "ln_f"):
        module = getattr(decoder, name, None)
        if isinstance(module, nn.Module):
            return module
    return None


ATTENTION_KINDS = ("full_attention", "sliding_attention", "chunked_attention")  # the layer types HF names


@dataclass(frozen=True)
class MaskLayout:
    """Which attention masks a model's layers need: `kinds` (from ATTENTION_KINDS, full first), the sliding
    layers' `window` (keys less than window positions back) and the chunked layers' `chunk` (keys in the query's
    block of chunk positions: Llama 4)."""

    kinds: tuple[str, ...]
    window: int | None = None
    chunk: int | None = None


def mask_layout(model: nn.Module, role: str = "model") -> MaskLayout:
    """The model's `MaskLayout`; ValueError for layer kinds a key/value cache cannot serve (conv, linear
    attention). A sliding or chunked kind without its size is full attention, as HF builds it."""
    text = model.config.get_text_config()
    window = getattr(text, "sliding_window", None)
    if getattr(text, "use_sliding_window", True) is False:
        window = None
    chunk = getattr(text, "attention_chunk_size", None)
    layer_types = set(getattr(text, "layer_types", None) or [])
    unsupported = layer_types - set(ATTENTION_KINDS)
    if unsupported:
        raise ValueError(f"{role}: {type(model).__name__} has layer types {sorted(unsupported)}, which the "
                         "key/value-cache adapter does not support")
    if not layer_types:  # no per-layer types: every layer slides when the config has a window
        layer_types = {"sliding_attention" if window is not None else "full_attention"}
    sized = {"sliding_attention": window, "chunked_attention": chunk}
    kinds = {kind if sized.get(kind, 1) is not None else "full_attention" for kind in layer_types}
    return MaskLayout(tuple(k for k in ATTENTION_KINDS if k in kinds), window if "sliding_attention" in kinds else None,
                      chunk if "chunked_attention" in kinds else None)


def check_runnable(model: nn.Module, role: str) -> None:
    """ValueError (naming `role`) unless `ModelRunner` can run the model exactly: a decoder-only LM with a key/value
    cache, an attention backend that takes tree masks, layer kinds it can mask, positions it can give."""
    check_decoder_cache(model, role)
    attention_backend(model)
    mask_layout(model, role)
    check_position_scheme(model, role)


class ModelRunner:
    """Run a stock HF decoder on per-row caches: node forwards with 4-D masks, ragged extensions, commits."""

    def __init__(self, model: nn.Module, batch: int, capture: nn.Module | None = None,
                 static: StaticPlan | None = None, row_slots: bool = False, role: str = "model"):
        self.model = model
        self.cache_keyword = cache_keyword(model)
        self.backend = attention_backend(model)
        self.layout = mask_layout(model)
        # the masks a forward passes: one kind's, or one per layer type (full among them), as HF's mixed models take
        kinds = self.layout.kinds
        self.mask_kinds = kinds if len(kinds) == 1 else tuple(dict.fromkeys(("full_attention", *kinds)))
        self.position_limit = position_limit(model)  # rows of an absolute position table, None for RoPE models
        if static is None:  # row_slots: sub-batches are views of one set of buffers (`SlotRowCache`)
            self.cache = (SlotRowCache if row_slots else RowCache)(batch, model_device(model))
        else:  # the fast mode: preallocated static layers, which the round's graph writes in place
            # a model whose layers outnumber its config's (a drafter head with extra cached layers) says so
            layers = getattr(model, "num_cache_layers", None) or model.config.get_text_config().num_hidden_layers
            self.cache = StaticRowCache(batch, model_device(model), layers, static.max_len, static.reserve,
                                        owner=model, role=role, mode=static.mode)
        self.capture = capture
        self._captured: Tensor | None = None
        self._hook = capture.register_forward_hook(self._capture) if capture is not None else None
        self.chain_valid = torch.zeros(batch, 0, dtype=torch.bool, device=self.cache.lengths.device)  # [B, R]

    def _capture(self, module, args, output) -> None:
        self._captured = output[0] if isinstance(output, tuple) else output

    def close(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    @property
    def captured(self) -> Tensor | None:
        """Output of the capture module in the last forward ([B, n, H])."""
        return self._captured

    def forward(self, positions: Tensor, attend: Tensor, order: Tensor | None = None, **inputs: Any):
        """Run n new round slots. positions: [B, n] (or [3, B, n] for M-RoPE); attend: [B, n, R + n] over the
        round's slots; order: [B, n] each slot's index in its row's token sequence (committed slot s is token
        s), which sliding windows and chunks count in as HF's masks do (by cache position); it defaults to
        1-D positions and is required with M-RoPE, whose image tokens share positions.

        Positions past an absolute position table are clamped to its last row: only a drafter's nodes reach
        them (the engine checks the target's positions before any forward and cuts tree nodes past each row's
        budget), and a worse draft there costs nothing but speed."""
        if order is None:
            if positions.dim() != 2:
                raise ValueError("ModelRunner.forward: M-RoPE positions [3, B, n] need each slot's token order")
            order = positions
        if self.position_limit is not None:
            positions = positions.clamp(max=self.position_limit - 1)
        full = self.cache.open_slots(order, attend)
        masks = {kind: self._format(self._restricted(kind, full)) for kind in self.mask_kinds}
        mask = next(iter(masks.values())) if len(masks) == 1 else masks
        return self.model(attention_mask=mask, position_ids=positions, use_cache=True,
                          **{self.cache_keyword: self.cache.cache}, **inputs)

    def _restricted(self, kind: str, full: Tensor) -> Tensor:
        """The [B, 1, n, S] mask of layers of `kind` from the causal tree mask `full`."""
        if kind == "sliding_attention":
            return self.cache.windowed(full, self.layout.window)
        if kind == "chunked_attention":
            return self.cache.chunked(full, self.layout.chunk)
        return full

    def _format(self, mask: Tensor) -> Tensor:
        """Bool masks for sdpa; additive float masks for eager attention."""
        if self.backend == "sdpa":
            return mask
        dtype = next(self.model.parameters()).dtype
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, torch.finfo(dtype).min)

    def forward_children(self, parent_slots: Tensor, positions: Tensor, **inputs: Any):
        """Run n new slots, each seeing its parent slot's view plus itself (-1 = only the committed prefix)."""
        return self.forward(positions, self.cache.round_attend(parent_slots), **inputs)

    def extend(self, valid: Tensor, positions: Tensor | None = None, **inputs: Any):
        """Run and commit a ragged block of certain tokens: row b keeps the entries where valid[b] is True.

        valid: [B, P] bool. Kept entries see the committed prefix and the earlier kept entries; the others
        see only themselves and are dropped. positions: [B, P] (or [3, B, P] for M-RoPE); by default the
        kept entries continue each row's committed length.
        """
        out = self.open_chain(valid, positions, **inputs)
        self.keep_chain(valid.sum(1))
        return out

    def open_chain(self, valid: Tensor, positions: Tensor | None = None, **inputs: Any):
        """Run a ragged block of known tokens as round slots that continue each row's chain; commit nothing.

        valid: [B, P] bool. Row b's valid entries see its committed prefix, the valid entries of its earlier
        `open_chain` blocks in this round and each other causally; the others see only themselves and are
        never kept. positions as in `extend`. Only `open_chain` may open slots until `keep_chain` closes the
        round (which keeps a prefix of each row's chain: e.g. a step and not the judge prompt after it).
        """
        if self.cache.round_length == 0:
            self.chain_valid = valid[:, :0]
        earlier = self.chain_valid  # [B, R]
        width = valid.shape[1]
        start = self.cache.lengths + earlier.sum(1)  # [B] next token of each row's chain
        order = (start[:, None] + valid.long().cumsum(1) - 1).clamp_min(0)  # [B, P]
        if positions is None:
            positions = order
        causal = torch.ones(width, width, dtype=torch.bool, device=valid.device).tril()
        eye = torch.eye(width, dtype=torch.bool, device=valid.device)
        block = (causal & valid[:, None, :] & valid[:, :, None]) | eye  # [B, P, P]
        attend = torch.cat([earlier[:, None, :] & valid[:, :, None], block], -1)  # [B, P, R + P]
        out = self.forward(positions, attend, order, **inputs)
        self.chain_valid = torch.cat([earlier, valid], 1)
        return out

    def keep_chain(self, counts: Tensor) -> None:
        """Commit the first counts[b] valid chain entries of row b, in order, and drop the rest of the round
        (nothing to do when no round is open)."""
        if self.cache.round_length == 0:
            return
        kept_first = torch.sort((~self.chain_valid).to(torch.uint8), dim=1, stable=True).indices  # [B, R]
        self.cache.commit(kept_first, counts)
        self.chain_valid = self.chain_valid[:, :0]

    def take_rows(self, rows: Tensor) -> ModelRunner:
        """A runner over the same model (capturing as this one does) on `rows` [b] of the cache: a copy, or a view
        of the same buffers when the cache is a `SlotRowCache`."""
        part = ModelRunner(self.model, 0, capture=self.capture)
        part.cache = self.cache.take_rows(rows)
        return part

    def put_rows(self, rows: Tensor, part: ModelRunner) -> None:
        """Overwrite `rows` [b] of the cache with `part`'s (from `take_rows`), and close `part`."""
        self.cache.put_rows(rows, part.cache)
        part.close()


@dataclass
class TargetOutput:
    logits: Tensor  # [B, n, V]
    features: Tensor | None  # [B, n, H] last-layer features (after the final norm) when requested


@dataclass
class PrefillOutput:
    """What the target saw of the prompt minus its last token (left-padded layout, [B, L-1, ...])."""

    features: Tensor | None = None  # [B, L-1, H] last-layer features, when the drafter needs them
    inputs_embeds: Tensor | None = None  # [B, L-1, H] merged input embeddings (VLMs: image rows are vision features)
    extras: dict = field(default_factory=dict)  # adapter-specific: image masks, rope deltas, attention scores
    next_logits: Tensor | None = None  # [B, V] first token's logits, for a prompt of conditioning inputs only


FEATURES, INPUTS_EMBEDS = "features", "inputs_embeds"


@runtime_checkable
class Target(Protocol):
    """What the engine needs from a target model. Rows are per-sequence; trees are verified in one forward.

    Optional: `check_roots(roots [B])`, which the engine's `begin` calls with the first roots (a VLM target refuses a
    prompt that ends inside an image), and `uniform_first_round`, true where the first verify has the later ones'
    shapes, so that the fast mode runs a greedy first round through the later rounds' graph (drafters say it too)."""

    vocab_size: int
    device: torch.device

    def start(self, batch: int, needs: frozenset[str] = frozenset()) -> None:
        """Reset per-generation state for `batch` rows; `needs` names what the drafter reads (FEATURES, ...)."""
        ...

    def check_model_inputs(self, model_inputs: dict) -> None:
        """Raise ValueError, before any work, for model inputs this target cannot take."""
        ...

    def prefill(self, input_ids: Tensor, attention_mask: Tensor, **model_inputs: Any) -> PrefillOutput:
        """Process a left-padded prompt block [B, L] (plus model inputs such as pixel values)."""
        ...

    def verify(self, tree: DraftTree) -> TargetOutput:
        """Run every tree node after the committed prefix; logits[:, i] is the distribution after node i."""
        ...

    def commit(self, path: Tensor, counts: Tensor) -> None:
        """Keep tree nodes `path[b, :counts[b]]` (the root and accepted drafts) of the last verify."""
        ...

    def select_rows(self, rows: Tensor) -> None:
        """Keep only these rows (finished rows stop costing compute)."""
        ...

    def close(self) -> None:
        """Release per-generation state (hooks, caches)."""
        ...


class RunnerOwner:
    """Public cache operations of a core adapter that owns a `ModelRunner` (`self.runner`), for callers that
    work with known tokens and sub-batches between rounds (step-level speculation in `specmm.reasoning`).

    The adapter stays the only owner of its model's cache: callers run known tokens as an open chain and keep
    a prefix of it, forget committed tokens, or copy rows out to a sub-batch adapter and write them back.
    """

    runner: ModelRunner | None
    row_slots: bool = False  # a caller that runs many sub-batches sets this before `start`: `take_rows` then
    # returns views of this adapter's buffers and `put_rows` copies nothing back (`specmm.core.slot_cache`)

    def open_chain(self, input_ids: Tensor, valid: Tensor) -> TargetOutput:
        """Run known tokens [B, P] as open round slots continuing each row's chain (valid [B, P] bool, see
        `ModelRunner.open_chain`); logits [B, P, V] after each token, features [B, P, H] when captured."""
        out = self.runner.open_chain(valid, input_ids=input_ids)
        return TargetOutput(logits=out.logits, features=self.runner.captured)

    def keep_chain(self, counts: Tensor) -> None:
        """Commit the first counts[b] valid chain tokens of row b and drop the rest of the round. counts: [B]."""
        self.runner.keep_chain(counts)

    def rewind(self, counts: Tensor) -> None:
        """Forget the last counts[b] committed tokens of row b (e.g. tokens a round committed past a stop)."""
        self.runner.cache.rewind(counts)

    def take_rows(self, rows: Tensor) -> Self:
        """An adapter of the same kind over `rows` [b] of the cache (a copy, or a view with `row_slots`; this
        one is left as it is), to run rounds on those rows alone; `put_rows` takes them back. Adapters with
        per-row state beyond the cache extend this."""
        part = copy.copy(self)
        part.runner = self.runner.take_rows(rows)
        return part

    def put_rows(self, rows: Tensor, part: Self) -> None:
        """Overwrite `rows` [b] with `part`'s rows (a `take_rows` adapter, possibly run since); closes `part`."""
        self.runner.put_rows(rows, part.runner)
        part.runner = None


class HFCausalLMTarget(RunnerOwner):
    """Adapter for a stock HF causal LM (`*ForCausalLM`): no patched modeling files, just masks and positions."""

    uniform_first_round = True  # compiled mode: its first verify has the later ones' shapes and no host sync

    def __init__(self, model: nn.Module):
        if not hasattr(model, "get_output_embeddings") or model.get_output_embeddings() is None:
            raise ValueError(f"target: {type(model).__name__} has no language-model head (expected a *ForCausalLM)")
        check_runnable(model, "target")
        self.model = model
        self.vocab_size = output_vocab_size(model)
        self.device = model_device(model)
        self.runner: ModelRunner | None = None
        self.static_plan: StaticPlan | None = None  # set by the engine in compiled mode

    def start(self, batch: int, needs: frozenset[str] = frozenset()) -> None:
        self.close()
        unknown = set(needs) - self.provides
        if unknown:
            raise ValueError(f"drafter: needs {sorted(unknown)} which {type(self).__name__} does not provide")
        capture = final_norm(self.model) if FEATURES in needs else None
        if FEATURES in needs and capture is None:
            raise ValueError(f"target: cannot find the final norm of {type(self.model).__name__} to read features")
        self.needs = frozenset(needs)
        self.runner = ModelRunner(self.model, batch, capture=capture, static=self.static_plan,
                                  row_slots=self.row_slots, role="target")

    def close(self) -> None:
        if self.runner is not None:
            self.runner.close()
            self.runner = None

    provides = frozenset({FEATURES})

    def check_model_inputs(self, model_inputs: dict) -> None:
        """Raise ValueError for inputs this target does not take (before any work)."""
        if model_inputs:
            raise ValueError(f"{', '.join(sorted(model_inputs))}: not an input of a text-only target")

    @torch.no_grad()
    def prefill(self, input_ids: Tensor, attention_mask: Tensor, **model_inputs: Any) -> PrefillOutput:
        if input_ids.shape[1] == 0:
            return PrefillOutput()
        self.runner.extend(attention_mask.bool(), input_ids=input_ids, logits_to_keep=1, **model_inputs)
        return PrefillOutput(features=self.runner.captured)

    @torch.no_grad()
    def verify(self, tree: DraftTree) -> TargetOutput:
        positions = self.runner.cache.lengths[:, None] + tree.depth  # [B, T]
        out = self.runner.forward(positions, tree.ancestors, input_ids=tree.tokens)
        return TargetOutput(logits=out.logits, features=self.runner.captured)

    def commit(self, path: Tensor, counts: Tensor) -> None:
        self.runner.cache.commit(path, counts)

    def select_rows(self, rows: Tensor) -> None:
        self.runner.cache.select_rows(rows)


# Modality packages register adapters for models the plain HF adapter cannot serve (e.g. Mamba2 in `ssm`).
_ADAPTERS: list[tuple[Callable[[Any], bool], Callable[[Any], Target]]] = []


def register_target_adapter(matches: Callable[[Any], bool], build: Callable[[Any], Target]) -> None:
    """Make `as_target` wrap models for which `matches(model)` is True with `build(model)`."""
    _ADAPTERS.insert(0, (matches, build))


def as_target(model: Any) -> Target:
    """Wrap a model in its target adapter (a `Target` is returned as is)."""
    if isinstance(model, Target) and not isinstance(model, nn.Module):
        return model
    for matches, build in _ADAPTERS:
        if matches(model):
            return build(model)
    if not isinstance(model, nn.Module):
        raise ValueError(f"target: expected a HF causal LM or a specmm Target, got {type(model).__name__}")
    return HFCausalLMTarget(model)
