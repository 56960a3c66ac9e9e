"""Target adapter for stock HF Mamba2 and hybrid SSM/attention causal LMs (Mamba2, Bamba, NemotronH, Zamba2).

The model runs unmodified except that, for the length of one forward, each Mamba2 mixer's `forward` is
swapped for the tree mixer (`tree_scan.tree_mixer_forward`), which reads this adapter's own conv/SSM state
store and never writes it. Attention layers of hybrids get per-layer-type mask dicts (ancestor masks over
a per-row KV cache) and positions prefix + depth. `commit` sets the SSM states of the accepted node in
closed form (or, for the vanilla baseline, by replaying the accepted inputs) and gathers the accepted KV rows.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn
from transformers import DynamicCache

from specmm.core.cache import RowCache
from specmm.core.target import (
    PrefillOutput,
    TargetOutput,
    attention_backend,
    model_device,
    output_vocab_size,
)
from specmm.core.tree import DraftTree
from specmm.ssm.tree_scan import (
    TreeLayout,
    TreeRecord,
    commit_state,
    is_mamba2_mixer,
    replay_state,
    tree_mixer_forward,
)

SUPPORTED_MODELS = ("Mamba2ForCausalLM", "BambaForCausalLM", "NemotronHForCausalLM", "Zamba2ForCausalLM")
STATEFUL_MODELS = ("MambaForCausalLM", "FalconMambaForCausalLM", "JambaForCausalLM",
                   "ZambaForCausalLM", "FalconH1ForCausalLM", "GraniteMoeHybridForCausalLM", "Qwen3NextForCausalLM")
LAYER_TYPES = {"linear_attention", "full_attention", "hybrid", "mlp", "moe"}
ATTENTION_TYPES = ("full_attention", "hybrid")  # Zamba2 "hybrid" layers: shared attention block + Mamba2
COMMIT_MODES = ("closed_form", "replay")


class _AttentionKV(DynamicCache):
    """A DynamicCache holding only the attention layers of a hybrid, addressed by their model layer index."""

    def __init__(self, attention_layers: list[int]):
        super().__init__()
        self.slot = {layer: i for i, layer in enumerate(attention_layers)}

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        return super().update(key_states, value_states, self.slot[layer_idx], *args, **kwargs)


class SSMStates:
    """Committed conv and SSM states of every Mamba2 layer, one row per sequence."""

    def __init__(self, mixers: dict[int, nn.Module], batch: int, device: torch.device, dtype: torch.dtype,
                 scan_dtype: torch.dtype):
        self.conv = {i: torch.zeros(batch, m.conv_dim, m.conv_kernel_size, device=device, dtype=dtype)
                     for i, m in mixers.items()}  # [B, C, K]
        self.ssm = {i: torch.zeros(batch, m.num_heads, m.head_dim, m.ssm_state_size, device=device,
                                   dtype=scan_dtype) for i, m in mixers.items()}  # [B, H, P, N]

    def select_rows(self, rows: Tensor) -> None:
        self.conv = {i: s[rows] for i, s in self.conv.items()}
        self.ssm = {i: s[rows] for i, s in self.ssm.items()}


class SSMTarget:
    """Tree verification for stock HF Mamba2 / hybrid models; `commit_mode="replay"` is the vanilla baseline."""

    provides: frozenset[str] = frozenset()

    def __init__(self, model: nn.Module, commit_mode: str = "closed_form", scan_dtype: torch.dtype | None = None,
                 prefill_block: int = 256):
        name = type(model).__name__
        if name not in SUPPORTED_MODELS:
            raise ValueError(f"target: {name} is not supported by the SSM adapter (supported: "
                             f"{', '.join(SUPPORTED_MODELS)})")
        if commit_mode not in COMMIT_MODES:
            raise ValueError(f"commit_mode: expected one of {COMMIT_MODES}, got {commit_mode!r}")
        if isinstance(prefill_block, bool) or not isinstance(prefill_block, int) or prefill_block < 1:
            raise ValueError(f"prefill_block: expected an integer >= 1, got {prefill_block!r}")
        config = model.config.get_text_config()
        layer_types = list(getattr(config, "layer_types", None) or [])
        unknown = set(layer_types) - LAYER_TYPES
        if unknown:
            raise ValueError(f"target: layer types {sorted(unknown)} of {name} are not supported")
        self.model = model
        self.mixers = {m.layer_idx: m for m in model.modules() if is_mamba2_mixer(m)}  # layer index -> mixer
        if not self.mixers:
            raise ValueError(f"target: found no Mamba2 mixer in {name}")
        self.attention_layers = [i for i, t in enumerate(layer_types) if t in ATTENTION_TYPES]
        if self.attention_layers:
            self.backend = attention_backend(model)
        self.commit_mode = commit_mode
        self.scan_dtype = scan_dtype
        self.prefill_block = prefill_block
        self.vocab_size = output_vocab_size(model)
        self.device = model_device(model)
        self.dtype = next(model.parameters()).dtype
        self.states: SSMStates | None = None
        self.kv: RowCache | None = None
        self._records: dict[int, TreeRecord] = {}

    # ------------------------------------------------------------------------------------------- protocol

    def start(self, batch: int, needs: frozenset[str] = frozenset()) -> None:
        if needs:
            raise ValueError(f"drafter: needs {sorted(needs)} which {type(self).__name__} does not provide")
        scan = self.scan_dtype or torch.promote_types(self.dtype, torch.float32)
        self.states = SSMStates(self.mixers, batch, self.device, self.dtype, scan)
        self.kv = None
        if self.attention_layers:
            self.kv = RowCache(batch, self.device)
            self.kv.cache = _AttentionKV(self.attention_layers)

    def close(self) -> None:
        self.states, self.kv, self._records = None, None, {}

    def check_model_inputs(self, model_inputs: dict) -> None:
        if model_inputs:
            raise ValueError(f"{', '.join(sorted(model_inputs))}: not an input of an SSM text target")

    @torch.no_grad()
    def prefill(self, input_ids: Tensor, attention_mask: Tensor, **model_inputs: Any) -> PrefillOutput:
        """Run the left-padded prompt block by block (each block is a ragged chain) and commit it."""
        for start in range(0, input_ids.shape[1], self.prefill_block):
            ids = input_ids[:, start:start + self.prefill_block]
            valid = attention_mask[:, start:start + self.prefill_block].bool()
            kernel = next(iter(self.mixers.values())).conv_kernel_size
            layout = TreeLayout.ragged_chain(valid, kernel)
            positions = attend = None
            if self.kv is not None:
                positions = (self.kv.lengths[:, None] + valid.long().cumsum(1) - 1).clamp_min(0)  # [B, P]
                attend = layout.ancestors
            self._forward(ids, layout, positions, attend, logits_to_keep=1)
            counts = valid.sum(1)  # [B]
            kept_first = torch.sort((~valid).to(torch.uint8), dim=1, stable=True).indices  # [B, P] valid first
            self._commit(kept_first, counts, mode="closed_form")  # the prompt is certain: no rollback to replay
        return PrefillOutput()

    @torch.no_grad()
    def verify(self, tree: DraftTree) -> TargetOutput:
        kernel = next(iter(self.mixers.values())).conv_kernel_size
        layout = TreeLayout.build(tree.parents, tree.depth, tree.ancestors, tree.valid, kernel)
        positions = attend = None
        if self.kv is not None:
            positions = self.kv.lengths[:, None] + tree.depth  # [B, n]
            attend = layout.ancestors
        out = self._forward(tree.tokens, layout, positions, attend)
        return TargetOutput(logits=out.logits, features=None)

    def commit(self, path: Tensor, counts: Tensor) -> None:
        self._commit(path, counts)

    def select_rows(self, rows: Tensor) -> None:
        self.states.select_rows(rows)
        if self.kv is not None:
            self.kv.select_rows(rows)

    # ------------------------------------------------------------------------------------------- internals

    def _forward(self, tokens: Tensor, layout: TreeLayout, positions: Tensor | None, attend: Tensor | None,
                 logits_to_keep: int = 0):
        """One stock forward over n nodes with the tree mixers swapped in; records per-layer commit tensors."""
        self._records = {}
        with self._tree_mixers(layout):
            if self.kv is None:
                return self.model(input_ids=tokens, use_cache=False, logits_to_keep=logits_to_keep)
            mask = self._format(self.kv.open_slots(positions, attend))  # [B, 1, n, S]
            return self.model(input_ids=tokens, attention_mask={"full_attention": mask, "linear_attention": None},
                              position_ids=positions, past_key_values=self.kv.cache, use_cache=True,
                              logits_to_keep=logits_to_keep)

    @contextmanager
    def _tree_mixers(self, layout: TreeLayout):
        def tree_forward(mixer):
            def forward(hidden_states, *args, **kwargs):
                out, record = tree_mixer_forward(mixer, hidden_states, layout, self.states.conv[mixer.layer_idx],
                                                 self.states.ssm[mixer.layer_idx], self.scan_dtype)
                self._records[mixer.layer_idx] = record
                return out
            return forward

        try:
            for mixer in self.mixers.values():
                mixer.forward = tree_forward(mixer)  # instance attribute: shadows the class method
            yield
        finally:
            for mixer in self.mixers.values():
                mixer.__dict__.pop("forward", None)

    def _format(self, mask: Tensor) -> Tensor:
        """Bool masks for sdpa; additive float masks for eager attention."""
        if self.backend == "sdpa":
            return mask
        return torch.zeros(mask.shape, dtype=self.dtype, device=mask.device).masked_fill_(
            ~mask, torch.finfo(self.dtype).min)

    def _commit(self, path: Tensor, counts: Tensor, mode: str | None = None) -> None:
        """Keep nodes path[b, :counts[b]] of the last forward (rows with counts 0 keep their states)."""
        has_node = counts > 0
        last = path.gather(1, (counts - 1).clamp_min(0)[:, None])[:, 0]  # [B]
        for layer, record in self._records.items():
            if (mode or self.commit_mode) == "closed_form":
                conv, ssm = commit_state(record, last)
            else:
                conv, ssm = replay_state(record, path, counts)
            keep = has_node[:, None, None]
            self.states.conv[layer] = torch.where(keep, conv.to(self.dtype), self.states.conv[layer])
            self.states.ssm[layer] = torch.where(keep[..., None], ssm.to(self.states.ssm[layer].dtype),
                                                 self.states.ssm[layer])
        self._records = {}
        if self.kv is not None:
            self.kv.commit(path, counts)


def is_ssm_model(model: Any) -> bool:
    return isinstance(model, nn.Module) and type(model).__name__ in SUPPORTED_MODELS + STATEFUL_MODELS


def build_target(model: nn.Module) -> SSMTarget:
    """`as_target` hook: the SSM adapter for supported models, a clear error for other stateful ones."""
    return SSMTarget(model)
