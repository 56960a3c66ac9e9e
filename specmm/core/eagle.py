"""EAGLE-1/2 feature-level drafter: fc([token embedding; target feature]) -> one Llama decoder layer.

The head predicts the target's next last-layer feature; the target's own (frozen) LM head turns it into
logits. Pair t of the head's input is (feature f_t, token x_{t+1}) at position t. Checkpoints use the
upstream EAGLE key names (`fc.*`, `layers.0.*`, optional `embed_tokens.weight`) and a Llama-style
`config.json`, so released EAGLE-1/2 heads load as they are.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import load_file
from safetensors.torch import save as save_safetensors
from torch import Tensor, nn

from specmm.core.acceptance import AcceptResult
from specmm.core.compiled import compiles
from specmm.core.drafters import CountsForwards, RoundSlots, accepted_tokens
from specmm.core.sampling import Generators, SamplingConfig
from specmm.core.target import FEATURES, ModelRunner, PrefillOutput, final_norm, model_device, output_vocab_size
from specmm.core.tree import DraftTree, ProcessDrafts, TreeSpec, grow_tree
from specmm.jobs import atomic_write_bytes, atomic_write_text

if TYPE_CHECKING:  # the Llama classes are imported where used: `from transformers import LlamaConfig` alone loads
    from transformers import LlamaConfig  # torchvision and torch._dynamo (seconds), which `import specmm` need not pay

logger = logging.getLogger(__name__)

_CONFIG_FIELDS = ("hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size",
                  "rms_norm_eps", "max_position_embeddings", "hidden_act", "head_dim")


def head_config_for(model: nn.Module, **overrides) -> LlamaConfig:
    """A one-layer Llama config matching the target's width, heads and rotary settings."""
    from transformers import LlamaConfig

    text = model.config.get_text_config()
    fields = {f: getattr(text, f) for f in _CONFIG_FIELDS if getattr(text, f, None) is not None}
    rope = getattr(text, "rope_parameters", None) or {}
    fields["rope_theta"] = rope.get("rope_theta", getattr(text, "rope_theta", 10000.0))
    fields["vocab_size"] = output_vocab_size(model)
    fields["attention_bias"] = bool(getattr(text, "attention_bias", False))
    fields.update(num_hidden_layers=1, architectures=["LlamaForCausalLM"])
    fields.update(overrides)
    return LlamaConfig(**fields)


def target_module(target) -> nn.Module:
    """The HF model behind `target` (an HF model, or a specmm target adapter holding it as `.model`)."""
    return target if isinstance(target, nn.Module) else getattr(target, "model", target)


def read_checkpoint(path: str | Path) -> tuple[dict, dict[str, Tensor]]:
    """(config.json as a dict, state dict) of a drafter folder: model.safetensors or an upstream
    pytorch_model.bin (loaded with weights_only)."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise ValueError(f"path: {path} has no config.json (expected a drafter checkpoint folder)")
    raw = json.loads((path / "config.json").read_text())
    if (path / "model.safetensors").is_file():
        return raw, load_file(path / "model.safetensors")
    if (path / "pytorch_model.bin").is_file():
        return raw, torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise ValueError(f"path: {path} has neither model.safetensors nor pytorch_model.bin")


def checkpoint_config(raw: dict) -> LlamaConfig:
    """The head config of a checkpoint: upstream `bias` is the fc's, `qkv_bias` the attention's."""
    from transformers import LlamaConfig

    config = LlamaConfig.from_dict(raw)
    config.attention_bias = bool(raw.get("qkv_bias", False))
    return config


class EagleHead(nn.Module):
    """fc on [token embedding; feature] -> Llama decoder layer(s); no input norm on layer 0, no final norm."""

    def __init__(self, config: LlamaConfig):
        from transformers import LlamaConfig, LlamaModel

        super().__init__()
        self.config = config
        hidden = config.hidden_size
        self.fc = nn.Linear(2 * hidden, hidden, bias=getattr(config, "bias", True))
        inner = LlamaConfig.from_dict({**config.to_dict(), "vocab_size": 1, "pad_token_id": None,
                                       "bos_token_id": None, "eos_token_id": None})
        inner._attn_implementation = config._attn_implementation
        self.decoder = LlamaModel(inner)  # embeddings unused (inputs_embeds is always given): vocabulary of 1
        self.decoder.norm = nn.Identity()
        self.decoder.layers[0].input_layernorm = nn.Identity()

    def forward(self, token_embeds: Tensor, features: Tensor, **kwargs):
        """token_embeds, features: [B, n, H] -> decoder output whose last_hidden_state predicts next features."""
        return self.decoder(inputs_embeds=self.fc(torch.cat([token_embeds, features], dim=-1)), **kwargs)

    def upstream_state_dict(self) -> dict[str, Tensor]:
        """Weights under the upstream EAGLE key names."""
        out = {}
        for key, value in self.state_dict().items():
            if key.startswith("decoder.embed_tokens"):
                continue
            out[key.removeprefix("decoder.")] = value
        return out

    def load_upstream_state_dict(self, state: dict[str, Tensor]) -> None:
        """Load upstream EAGLE keys (`embed_tokens.weight` is the target's frozen copy and is skipped)."""
        expected = self.upstream_state_dict()
        state = {k: v for k, v in state.items() if k != "embed_tokens.weight"}
        missing = sorted(set(expected) - set(state))
        if self.config.attention_bias and missing == ["layers.0.self_attn.o_proj.bias"]:
            state["layers.0.self_attn.o_proj.bias"] = torch.zeros_like(expected["layers.0.self_attn.o_proj.bias"])
            missing = []
        unexpected = sorted(set(state) - set(expected))
        if missing or unexpected:
            raise ValueError(f"EAGLE checkpoint does not match the head layout: missing {missing}, "
                             f"unexpected {unexpected}")
        for key, value in state.items():
            if value.shape != expected[key].shape:
                raise ValueError(f"EAGLE checkpoint: {key} has shape {tuple(value.shape)}, "
                                 f"expected {tuple(expected[key].shape)}")
        own = {("decoder." + k if k.startswith("layers.") else k): v for k, v in state.items()}
        self.load_state_dict(own, strict=False)


class EagleDrafter(CountsForwards):
    """EAGLE-1/2 drafter over a target: needs the target's features; tree nodes are never cached."""

    needs = frozenset({FEATURES})
    processes_drafts = True  # draft() takes the target's logits processors (`process`)
    uniform_first_round = True  # compiled mode: the state `start` leaves has the later rounds' shapes
    layout = "eagle"  # recorded in the saved config.json as `specmm_layout`

    def __init__(self, head: EagleHead, target_model: nn.Module):
        hidden = target_model.config.get_text_config().hidden_size
        if head.config.hidden_size != hidden:
            raise ValueError(f"drafter: EAGLE head hidden_size {head.config.hidden_size} != "
                             f"target hidden_size {hidden}")
        if final_norm(target_model) is None:
            raise ValueError(f"target: cannot find the final norm of {type(target_model).__name__} for EAGLE features")
        self.head = head
        self.embed_tokens = target_model.get_input_embeddings()
        self.lm_head = target_model.get_output_embeddings()
        self.vocab_size = output_vocab_size(target_model)
        self.device = model_device(head)
        self.draft_forwards = 0
        self.runner: ModelRunner | None = None
        self.static_plan = None  # set by the engine in compiled mode

    @classmethod
    def for_target(cls, target, **config_overrides) -> EagleDrafter:
        """A freshly initialised head sized for `target` (an HF model or a specmm target adapter)."""
        model = target_module(target)
        return cls._build(model, head_config_for(model, **config_overrides))

    @classmethod
    def from_pretrained(cls, path: str | Path, target) -> EagleDrafter:
        """Load a head saved by `save_pretrained` or an upstream EAGLE-1/2 checkpoint folder."""
        raw, state = read_checkpoint(path)
        return cls._build(target_module(target), checkpoint_config(raw), state)

    @classmethod
    def _build(cls, model: nn.Module, config: LlamaConfig, state: dict[str, Tensor] | None = None) -> EagleDrafter:
        """A head of `config` on the target's device and dtype, with `state` (upstream keys) loaded if given."""
        config._attn_implementation = "sdpa"
        cls._check_config(config, model)
        ref = next(model.parameters())
        head = cls._new_head(config).to(device=ref.device, dtype=ref.dtype)  # cast first: no precision lost
        if state is not None:
            head.load_upstream_state_dict(state)
        return cls(head, model)

    @classmethod
    def _new_head(cls, config: LlamaConfig) -> nn.Module:
        return EagleHead(config)

    @classmethod
    def _check_config(cls, config: LlamaConfig, model: nn.Module) -> None:
        """Raise before any weights are built or loaded when `config` cannot serve `model` (subclasses)."""

    def save_pretrained(self, path: str | Path) -> None:
        """config.json (with `specmm_layout`) and model.safetensors under upstream key names. The file's metadata is
        one key: safetensors writes several in a per-process random order, and a build must be byte-reproducible."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        config = {**self.head.config.to_dict(), "specmm_layout": self.layout}
        config.pop("_attn_implementation_internal", None)
        atomic_write_text(path / "config.json", json.dumps(config, indent=2, default=str))
        state = {k: v.detach().contiguous().cpu() for k, v in self.head.upstream_state_dict().items()}
        atomic_write_bytes(path / "model.safetensors", save_safetensors(state, metadata={"format": "pt"}))

    def check_spec(self, spec: TreeSpec) -> None:
        return None

    def start(self, input_ids: Tensor, attention_mask: Tensor, prefill: PrefillOutput) -> None:
        target_features = prefill.features
        batch, length = input_ids.shape
        self.runner = ModelRunner(self.head, batch, static=self.static_plan)
        self.draft_forwards = 0
        self.next_position = torch.zeros(batch, dtype=torch.long, device=input_ids.device)  # [B]
        hidden = self.head.config.hidden_size
        valid = attention_mask.bool()
        if length == 1:
            features = torch.zeros(batch, 1, hidden, device=input_ids.device, dtype=self.lm_head.weight.dtype)
            self._start_pending(self._inputs(self.embed_tokens(input_ids), features), valid)
            return
        # pair (f_{t-1}, x_t) for t = 1..L-1; a row whose prompt is one token gets (0, x_0)
        pairs_valid = valid[:, 1:] & valid[:, :-1]
        lone = ~pairs_valid.any(1)
        features = target_features.clone()
        features[lone, -1] = 0
        pairs_valid[lone, -1] = True
        self._start_pending(self._inputs(self.embed_tokens(input_ids[:, 1:]), features), pairs_valid)

    def _start_pending(self, inputs: dict[str, Tensor], valid: Tensor, positions: Tensor | None = None) -> None:
        """The prompt's slots (inputs [B, P, H] each, valid [B, P], positions [B, P]), which the first draft runs.
        In compiled mode all but the last run here, and the last (the root's, valid in every row) waits padded to the
        later rounds' width: the first round then has their shapes and runs their graph."""
        self._set_pending(inputs, valid, positions)
        if not compiles(self.static_plan):
            return
        inputs, valid, positions = self.pending_inputs, self.pending_valid, self.pending_positions
        if valid.shape[1] > 1:
            self.runner.extend(valid[:, :-1], positions=positions[:, :-1], **{k: v[:, :-1] for k, v in inputs.items()})
            self.count_forwards()
        spare = self.static_plan.round_tokens - 1

        def last(t: Tensor) -> Tensor:  # [B, P, ...] -> [B, 1 + spare, ...]: the last slot, then padding
            return nn.functional.pad(t[:, -1:], (0, 0) * (t.dim() - 2) + (0, spare))

        self.pending_inputs = {k: last(v) for k, v in inputs.items()}
        self.pending_valid, self.pending_positions = last(valid), last(positions)

    def _inputs(self, token_embeds: Tensor, features: Tensor) -> dict[str, Tensor]:
        """Head inputs for slots whose token embeddings [B, n, H] pair with features [B, n, H]."""
        return {"token_embeds": token_embeds, "features": features}

    def _set_pending(self, inputs: dict[str, Tensor], valid: Tensor, positions: Tensor | None = None) -> None:
        """Slots to run at the next draft: inputs [B, P, H] each, valid [B, P], optional positions [B, P]."""
        if positions is None:
            positions = self.next_position[:, None] + valid.long().cumsum(1) - 1
        self.pending_inputs, self.pending_valid, self.pending_positions = inputs, valid, positions.clamp_min(0)

    @torch.no_grad()
    def draft(self, roots: Tensor, spec: TreeSpec, sampling: SamplingConfig, generators: Generators,
              process: ProcessDrafts | None = None) -> DraftTree:
        rows = torch.arange(roots.shape[0], device=roots.device)
        out = self.runner.extend(self.pending_valid, positions=self.pending_positions, **self.pending_inputs)
        self.count_forwards()
        # the last valid slot: the prompt's pending slots have holes (left padding, dropped image slots)
        last = _last_true(self.pending_valid)  # [B]
        root_hidden = out.last_hidden_state[rows, last]  # [B, H]
        root_position = self.pending_positions[rows, last]  # [B] real position (may exceed the cache length)
        self.next_position = root_position + 1
        slots = RoundSlots(root_hidden)

        def expand(tokens: Tensor, parent_slots: Tensor) -> Tensor:
            depth = slots.child_depth(parent_slots)  # [B, n]
            self.count_forwards()
            out = self.runner.forward_children(parent_slots, root_position[:, None] + depth,
                                               **self._inputs(self.embed_tokens(tokens),
                                                              slots.parent_hidden(parent_slots)))
            slots.add(depth, out.last_hidden_state)
            return self.lm_head(out.last_hidden_state)

        tree = grow_tree(spec, roots, self.lm_head(root_hidden), self._expander(expand, root_hidden), sampling,
                         generators, process=process)
        self.runner.cache.rollback()  # tree nodes were fed predicted features: never kept
        return tree

    def _expander(self, expand, root_hidden: Tensor):
        """The tree builder's callback (subclasses may answer some depths without a forward)."""
        return expand

    def update(self, tree: DraftTree, result: AcceptResult, path_features: Tensor | None) -> None:
        steps = torch.arange(result.path.shape[1], device=result.path.device)
        self._set_pending(self._inputs(self.embed_tokens(accepted_tokens(tree, result)), path_features),
                          steps[None, :] <= result.num_accepted[:, None])

    def select_rows(self, rows: Tensor) -> None:
        self.runner.cache.select_rows(rows)
        self.next_position = self.next_position[rows]
        self._set_pending({k: v[rows] for k, v in self.pending_inputs.items()}, self.pending_valid[rows],
                          self.pending_positions[rows])


def _last_true(mask: Tensor) -> Tensor:
    """[B, P] bool with a True in every row -> [B] index of each row's last True."""
    return mask.shape[1] - 1 - mask.flip(1).long().argmax(1)
