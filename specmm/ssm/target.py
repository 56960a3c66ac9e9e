"""Target adapter for stock HF Mamba2 and hybrid SSM/attention causal LMs (Mamba2, Bamba, NemotronH, Zamba2,
Falcon-H1, GraniteMoeHybrid).

The model runs unmodified except that, for the length of one forward, each Mamba2 mixer's `forward` is
swapped for the tree mixer (`tree_scan.tree_mixer_forward`), which reads this adapter's own conv/SSM state
store and never writes it. Attention layers of hybrids get per-layer-type mask dicts (ancestor masks over
a per-row KV cache) and positions prefix + depth. `commit` sets the SSM states of the accepted node in
closed form (or, for the vanilla baseline, by replaying the accepted inputs) and gathers the accepted KV rows.

The fast mode (the engine sets `static_plan`): the attention layers get a `StaticRowCache`, the states are written
in place, and the verify (layout, conv-window gather, tree scan, attention) and the state commit (`specmm.ssm.steps`,
shared by every adapter of the model) are traced into the round's one graph; prefills stay eager.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from transformers import DynamicCache
from transformers.cache_utils import Cache

from specmm.core.cache import RowCache
from specmm.core.compiled import StaticPlan, compiles
from specmm.core.resident import resident
from specmm.core.static_cache import StaticRowCache
from specmm.core.target import (
    PrefillOutput,
    TargetOutput,
    attention_backend,
    model_device,
    output_vocab_size,
)
from specmm.core.tree import DraftTree
from specmm.ssm.steps import TreeSteps, tree_steps
from specmm.ssm.tree_scan import TreeRecord, chain_tree, is_mamba2_mixer, tree_attention

SUPPORTED_MODELS = ("Mamba2ForCausalLM", "BambaForCausalLM", "NemotronHForCausalLM", "Zamba2ForCausalLM",
                    "FalconH1ForCausalLM", "GraniteMoeHybridForCausalLM")
STATEFUL_MODELS = ("MambaForCausalLM", "FalconMambaForCausalLM", "JambaForCausalLM", "ZambaForCausalLM",
                   "Qwen3NextForCausalLM")
LAYER_TYPES = {"linear_attention", "full_attention", "hybrid", "mlp", "moe"}
ATTENTION_TYPES = ("full_attention", "hybrid")  # "hybrid" layers: Zamba2's shared attention block + Mamba2,
# Falcon-H1's attention and Mamba2 in parallel
COMMIT_MODES = ("closed_form", "replay")


class _AttentionKV(DynamicCache):
    """A DynamicCache holding only the attention layers of a hybrid, addressed by their model layer index."""

    def __init__(self, attention_layers: list[int]):
        super().__init__()
        self.slot = {layer: i for i, layer in enumerate(attention_layers)}

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        return super().update(key_states, value_states, self.slot[layer_idx], *args, **kwargs)


class _StaticAttentionKV(Cache):
    """The static twin of `_AttentionKV`: a `StaticRowCache`'s `StaticLayer`s, addressed by model layer index."""

    def __init__(self, layers: list, attention_layers: list[int]):
        super().__init__(layers=layers)
        self.slot = {layer: i for i, layer in enumerate(attention_layers)}

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        return super().update(key_states, value_states, self.slot[layer_idx], *args, **kwargs)


class SSMStates:
    """Committed conv and SSM states of every Mamba2 layer, one row per sequence."""

    def __init__(self, mixers: dict[int, nn.Module], batch: int, device: torch.device, dtype: torch.dtype,
                 scan_dtype: torch.dtype, owner: object | None = None, mode: str | None = None):
        # under CUDA graphs (`mode`) the states are `owner`'s resident buffers, which a round writes in place
        self.conv = {i: resident(owner, f"conv.{i}", torch.zeros(batch, m.conv_dim, m.conv_kernel_size, device=device,
                                                                  dtype=dtype), mode)
                     for i, m in mixers.items()}  # [B, C, K]
        self.ssm = {i: resident(owner, f"ssm.{i}", torch.zeros(batch, m.num_heads, m.head_dim, m.ssm_state_size,
                                                                device=device, dtype=scan_dtype), mode)
                    for i, m in mixers.items()}  # [B, H, P, N]

    def select_rows(self, rows: Tensor) -> None:
        self.conv = {i: s[rows] for i, s in self.conv.items()}
        self.ssm = {i: s[rows] for i, s in self.ssm.items()}


class SSMTarget:
    """Tree verification for stock HF Mamba2 / hybrid models; `commit_mode="replay"` is the vanilla baseline."""

    provides: frozenset[str] = frozenset()
    uniform_first_round = True  # compiled mode: the first verify has the later ones' shapes (`_prompt_depth`)

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
        self._own_steps = TreeSteps(model, self.mixers)  # eager; compiled mode uses the model's shared steps
        self.steps = self._own_steps
        self.static_plan: StaticPlan | None = None  # set by the engine in the fast mode

    # ------------------------------------------------------------------------------------------- protocol

    def start(self, batch: int, needs: frozenset[str] = frozenset()) -> None:
        if needs:
            raise ValueError(f"drafter: needs {sorted(needs)} which {type(self).__name__} does not provide")
        scan = self.scan_dtype or torch.promote_types(self.dtype, torch.float32)
        plan = self.static_plan
        mode = plan.mode if compiles(plan) else None
        self.states = SSMStates(self.mixers, batch, self.device, self.dtype, scan, owner=self.model, mode=mode)
        self.kv = None
        if self.attention_layers and plan is None:
            self.kv = RowCache(batch, self.device)
            self.kv.cache = _AttentionKV(self.attention_layers)
        elif self.attention_layers:
            self.kv = StaticRowCache(batch, self.device, len(self.attention_layers), plan.max_len, plan.reserve,
                                     owner=self.model, role="ssm-attention", mode=mode)
            self.kv.cache = _StaticAttentionKV(self.kv.cache.layers, self.attention_layers)
        # the depth of the verify's prompt nodes: 0 in the first verify (its roots are the prompts' last tokens), -1
        # (none) after it; a tensor, written in place, so the first round runs the later rounds' compiled graph
        self._prompt_depth = resident(self.model, "prompt-depth", torch.zeros((), dtype=torch.long,
                                                                              device=self.device), mode)
        self.steps = self._own_steps
        if compiles(plan):  # the model's shared steps: every adapter of it traces the same functions, one graph
            self.steps = tree_steps(self.model, self.mixers)
        self.steps.tree_pass.install()

    def close(self) -> None:
        self.steps.tree_pass.uninstall()
        self.states, self.kv, self._records = None, None, {}

    def check_model_inputs(self, model_inputs: dict) -> None:
        if model_inputs:
            raise ValueError(f"{', '.join(sorted(model_inputs))}: not an input of an SSM text target")

    @torch.no_grad()
    def prefill(self, input_ids: Tensor, attention_mask: Tensor, **model_inputs: Any) -> PrefillOutput:
        """Run the left-padded prompt block by block (each block is a ragged chain) and commit it."""
        for start in range(0, input_ids.shape[1], self.prefill_block):  # eager: one shape per prompt block
            ids = input_ids[:, start:start + self.prefill_block]
            valid = attention_mask[:, start:start + self.prefill_block].bool()
            parents, depth, ancestors = chain_tree(valid)
            positions = None
            if self.kv is not None:
                positions = (self.kv.lengths[:, None] + valid.long().cumsum(1) - 1).clamp_min(0)  # [B, P]
            self._forward(ids, parents, depth, ancestors, valid, positions, logits_to_keep=1, prompt=True)
            counts = valid.sum(1)  # [B]
            kept_first = torch.sort((~valid).to(torch.uint8), dim=1, stable=True).indices  # [B, P] valid first
            self._commit(kept_first, counts, replay=False)  # the prompt is certain: no rollback
        return PrefillOutput()

    @torch.no_grad()
    def verify(self, tree: DraftTree) -> TargetOutput:
        positions = None
        if self.kv is not None:
            positions = self.kv.lengths[:, None] + tree.depth  # [B, n]
        prompt = tree.depth == self._prompt_depth  # [B, n] the prompt's last token, first round
        self._prompt_depth.fill_(-1)
        logits = self._forward(tree.tokens, tree.parents, tree.depth, tree.ancestors, tree.valid, positions,
                               prompt=prompt)
        return TargetOutput(logits=logits, features=None)

    @torch.no_grad()
    def commit(self, path: Tensor, counts: Tensor) -> None:
        self._commit(path, counts, replay=self.commit_mode == "replay")

    def select_rows(self, rows: Tensor) -> None:
        self.states.select_rows(rows)
        if self.kv is not None:
            self.kv.select_rows(rows)

    # ------------------------------------------------------------------------------------------- internals

    def _forward(self, tokens: Tensor, parents: Tensor, depth: Tensor, ancestors: Tensor, valid: Tensor,
                 positions: Tensor | None, logits_to_keep: int = 0, prompt: Tensor | bool = False) -> Tensor:
        """One stock forward over n nodes with the tree mixers swapped in; keeps the per-layer commit records."""
        verify = self.steps.verify
        inputs = dict(input_ids=tokens, parents=parents, depth=depth, ancestors=ancestors, valid=valid,
                      conv=self.states.conv, ssm=self.states.ssm, scan_dtype=self.scan_dtype,
                      logits_to_keep=logits_to_keep, prompt=prompt)
        if self.kv is not None:
            mask = self._format(self.kv.open_slots(positions, tree_attention(ancestors, valid)))  # [B, 1, n, S]
            inputs.update(attention_mask=mask, position_ids=positions, past_key_values=self.kv.cache)
        try:
            logits, self._records = verify(**inputs)
        finally:
            self.steps.tree_pass.finish()
        return logits

    def _format(self, mask: Tensor) -> Tensor:
        """Bool masks for sdpa; additive float masks for eager attention."""
        if self.backend == "sdpa":
            return mask
        return torch.zeros(mask.shape, dtype=self.dtype, device=mask.device).masked_fill_(
            ~mask, torch.finfo(self.dtype).min)

    def _commit(self, path: Tensor, counts: Tensor, replay: bool) -> None:
        """Keep nodes path[b, :counts[b]] of the last forward (rows with counts 0 keep their states)."""
        if self._records:
            commit = self.steps.commits[replay]
            ancestors = next(iter(self._records.values())).ancestors
            commit(records=self._records, path=path, counts=counts, ancestors=ancestors, conv=self.states.conv,
                   ssm=self.states.ssm)
        self._records = {}
        if self.kv is not None:
            self.kv.commit(path, counts)


def is_ssm_model(model: Any) -> bool:
    return isinstance(model, nn.Module) and type(model).__name__ in SUPPORTED_MODELS + STATEFUL_MODELS


def build_target(model: nn.Module) -> SSMTarget:
    """`as_target` hook: the SSM adapter for supported models, a clear error for other stateful ones."""
    return SSMTarget(model)
