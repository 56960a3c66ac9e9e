"""EAGLE-style image drafter: one LlamaGen decoder layer with 2-D RoPE on [token embedding ; target feature].

Runs on both guidance halves (cond and uncond target features, same tokens) and combines its logits with
the target's guidance scale before the shared sampling order, as LANTERN's drafter does. The token
embedding and output head are the target's own (frozen); only `fc` and the layer are trained. Each head run is a
module (`HeadRun`), compiled in compiled mode.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch
from safetensors.torch import load_file, save
from torch import Tensor, nn

from specmm.core.acceptance import AcceptResult
from specmm.core.compiled import StaticPlan
from specmm.core.drafters import CountsForwards, RoundSlots, accepted_tokens
from specmm.core.sampling import Generators, SamplingConfig
from specmm.core.target import FEATURES, PrefillOutput
from specmm.core.tree import DraftTree, TreeSpec, grow_tree
from specmm.image_ar.llamagen.config import GPTConfig
from specmm.image_ar.llamagen.gpt import (
    KVCache,
    LlamaGenGPT,
    TransformerBlock,
    rope_table_2d,
)
from specmm.image_ar.compiled import kept_cache, part
from specmm.image_ar.target import GuidedTarget, cache_rows, combine, pack
from specmm.jobs.atomic import atomic_write_bytes, atomic_write_text


class DraftHead(nn.Module):
    """fc([emb(x_j); f_j]) -> one decoder layer -> predicted feature f_{j+1} (rotary cell j)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.fc = nn.Linear(2 * config.dim, config.dim, bias=False)
        self.layer = TransformerBlock(config)
        self.register_buffer("rope", rope_table_2d(config.grid_size, config.head_dim, config.rope_base, 0),
                             persistent=False)

    def forward(self, token_embeds: Tensor, features: Tensor, cells: Tensor, mask: Tensor | None,
                cache: KVCache | None = None, slots: Tensor | None = None) -> Tensor:
        """token_embeds, features [R, n, d]; cells [R, n] grid cells -> predicted features [R, n, d]."""
        x = self.fc(torch.cat([token_embeds, features], -1))
        rope = self.rope[cells.clamp(max=self.config.block_size - 1)]
        return self.layer(x, rope, mask, cache, 0, slots)


def head_config(target_config: GPTConfig, **overrides) -> GPTConfig:
    """The drafter's layer config: the target's width, heads and grid (one layer)."""
    return replace(target_config, n_layer=1, **overrides)


class ImageDrafter(CountsForwards):
    """Core `Drafter` around a `DraftHead`, reading the target's features on both guidance halves. `gpt` is the
    image model's `lm` view (a LlamaGen GPT, or an adapter's: `config`, `tok_embeddings`, `logits`); `for_target`
    and `from_pretrained` also take the model itself (a LlamaGen, or a stock generator `ImageSampler` serves)."""

    needs = frozenset({FEATURES})

    def __init__(self, head: DraftHead, gpt: LlamaGenGPT):
        gpt = drafter_view(gpt)
        if head.config.dim != gpt.config.dim or head.config.block_size != gpt.config.block_size:
            raise ValueError(f"drafter: head (dim {head.config.dim}, block {head.config.block_size}) does not fit "
                             f"the GPT (dim {gpt.config.dim}, block {gpt.config.block_size})")
        self.head, self.gpt = head, gpt
        self.vocab_size, self.device = gpt.config.vocab_size, gpt.tok_embeddings.weight.device
        self.draft_forwards = 0
        self.target: GuidedTarget | None = None
        self.static_plan: StaticPlan | None = None  # set by the engine in the fast mode: a kept cache

    @classmethod
    def for_target(cls, gpt: LlamaGenGPT, **overrides) -> ImageDrafter:
        gpt = drafter_view(gpt)
        ref = gpt.tok_embeddings.weight
        return cls(DraftHead(head_config(gpt.config, **overrides)).to(ref.device, ref.dtype), gpt)

    def save_pretrained(self, path: str | Path) -> None:
        """config.json and model.safetensors into `path`, each written atomically (a killed save leaves the old
        file or the new one, never half of one)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        weights = {k: v.detach().contiguous().cpu() for k, v in self.head.state_dict().items()}
        atomic_write_bytes(path / "model.safetensors", save(weights))
        atomic_write_text(path / "config.json", json.dumps(self.head.config.to_dict(), indent=2))

    @staticmethod
    def read_config(path: str | Path) -> GPTConfig:
        """The head's config in the folder `path`; ValueError for a folder another kind of model saved (a VLM
        drafter, an HF model: their config.json has fields an image drafter's has not)."""
        path = Path(path)
        if not (path / "config.json").is_file():
            raise ValueError(f"drafter: {path} has no config.json (expected an image drafter folder, saved by "
                             "`specmm train-image-drafter` or ImageDrafter.save_pretrained)")
        fields = json.loads((path / "config.json").read_text())
        foreign = sorted(set(fields) - set(GPTConfig.__dataclass_fields__)) if isinstance(fields, dict) else ["?"]
        if foreign:
            shown = ", ".join(foreign[:4]) + (", ..." if len(foreign) > 4 else "")
            raise ValueError(f"drafter: {path} is not an image drafter folder (its config.json has fields {shown} of "
                             "another kind of model); give a folder saved by `specmm train-image-drafter`")
        return GPTConfig(**fields)

    @classmethod
    def from_pretrained(cls, path: str | Path, gpt: LlamaGenGPT) -> ImageDrafter:
        path, gpt = Path(path), drafter_view(gpt)
        config = cls.read_config(path)
        drafter = cls(DraftHead(config), gpt)
        drafter.head.load_state_dict(load_file(path / "model.safetensors"))
        ref = gpt.tok_embeddings.weight
        drafter.head.to(ref.device, ref.dtype).eval()
        return drafter

    def bind(self, target: GuidedTarget) -> ImageDrafter:
        self.target = target
        return self

    def check_fits(self, lm: LlamaGenGPT) -> None:
        """ValueError unless this drafter was made for a model of `lm`'s width, vocabulary and image grid (a head
        of another width fails inside its first forward; another grid would draft with the wrong 2-D positions)."""
        ours, theirs = self.gpt.config, drafter_view(lm).config
        for name in ("dim", "vocab_size", "block_size"):
            if getattr(ours, name) != getattr(theirs, name):
                raise ValueError(f"proposer: this ImageDrafter was made for a model with {name} "
                                 f"{getattr(ours, name)}, but the sampler's model has {getattr(theirs, name)}: "
                                 "make it with ImageDrafter.for_target(model) or load it for this model")

    # ------------------------------------------------------------------ engine protocol
    def check_spec(self, spec: TreeSpec) -> None:
        return None

    def start(self, input_ids: Tensor, attention_mask: Tensor, prefill: PrefillOutput) -> None:
        if self.target is None:
            raise ValueError("drafter: call bind(target) (ImageSampler does) before generating")
        batch = input_ids.shape[0]
        rows = 2 * batch if self.target.guided else batch
        c = self.head.config
        ref = self.gpt.tok_embeddings.weight
        length = c.block_size + self.target.max_nodes + 1
        self.cache = kept_cache(self.head, "drafter", (rows, length, ref.dtype, ref.device),
                                lambda: KVCache(1, rows, c.kv_heads, length, c.head_dim, ref.dtype, ref.device),
                                self.static_plan)
        self.lengths = torch.zeros(batch, dtype=torch.long, device=input_ids.device)  # [B] committed slots
        self.draft_forwards = 0
        self.pending = (input_ids[:, -1:], prefill.features, torch.ones_like(input_ids[:, -1:], dtype=torch.bool))

    @torch.no_grad()
    def draft(self, roots: Tensor, spec: TreeSpec, sampling: SamplingConfig, generators: Generators) -> DraftTree:
        """Run the pending tokens, then grow the tree (in the fast mode, traced into the round's one graph; a sampled
        chain draws from the round's draw tape there)."""
        tokens, features, valid = self.pending
        out = part(self.head, DraftRound, self.gpt)(
            roots=roots, tokens=tokens, features=features, valid=valid, lengths=self.lengths, cache=self.cache,
            cfg_scale=self.target.cfg_tensor, guided=self.target.guided, spec=spec, sampling=sampling,
            generators=generators)
        self.lengths = out[-1]
        self.count_forwards(head_runs(spec))
        return DraftTree(*out[:4], max_depth=spec.depth, max_children=spec.max_children, draft_probs=out[5],
                         node_slots=out[4])

    def update(self, tree: DraftTree, result: AcceptResult, path_features: Tensor | None) -> None:
        steps = torch.arange(result.path.shape[1], device=result.path.device)
        self.pending = (accepted_tokens(tree, result), path_features, steps[None, :] <= result.num_accepted[:, None])

    def select_rows(self, rows: Tensor) -> None:
        kept = torch.cat([rows, rows + self.lengths.shape[0]]) if self.target.guided else rows
        self.cache.select_rows(kept)
        self.lengths = self.lengths[rows]
        self.pending = tuple(p[rows] for p in self.pending)


def drafter_view(model) -> LlamaGenGPT:
    """What a drafter reads of `model`: a LlamaGen GPT or an adapter's `lm` as is, else its image model's `lm`."""
    if all(hasattr(model, name) for name in ("config", "tok_embeddings", "logits")):
        return model
    from specmm.image_ar.models import image_model_for

    return image_model_for(model).lm


def unpack(features: Tensor, guided: bool) -> Tensor:
    """[B, n, F] packed halves -> [R, n, d]."""
    return torch.cat(features.chunk(2, -1)) if guided else features


class HeadRun(nn.Module):
    """One drafter head run on both guidance halves (token embeddings, the head's layer, optionally logits)."""

    def __init__(self, head: DraftHead, gpt: LlamaGenGPT):
        super().__init__()
        self.head, self.gpt = head, gpt

    def forward(self, tokens: Tensor, features: Tensor, cells: Tensor, slots: Tensor, attend: Tensor, cache: KVCache,
                cfg_scale: Tensor, guided: bool, logits: bool) -> tuple[Tensor, Tensor | None]:
        embeds = self.gpt.tok_embeddings(cache_rows(tokens, guided))
        hidden = self.head(embeds, unpack(features, guided), cache_rows(cells, guided),
                           cache_rows(attend, guided)[:, None], cache, cache_rows(slots, guided))
        if not logits:
            return hidden, None
        return hidden, combine(self.gpt.logits(hidden), None, cfg_scale, guided, -1)


def head_runs(spec: TreeSpec) -> int:
    """Head runs of one round: the pending tokens, then one per tree level that has children to draft."""
    if spec.kind != "static":
        return spec.depth
    parents, _, depths = spec.static_layout
    return 1 + len({depths[p] for p in parents[1:] if p > 0})


class DraftRound(nn.Module):
    """One drafter round: run the pending tokens (accepted last round) to get the root's hidden state, then grow
    the tree with `grow_tree`, each expansion one head run over the new nodes."""

    def __init__(self, head: DraftHead, gpt: LlamaGenGPT):
        super().__init__()
        self.run_head = part(head, HeadRun, gpt)
        self.block = head.config.block_size

    def forward(self, roots: Tensor, tokens: Tensor, features: Tensor, valid: Tensor, lengths: Tensor, cache: KVCache,
                cfg_scale: Tensor, guided: bool, spec: TreeSpec, sampling: SamplingConfig, generators: Generators
                ) -> tuple:
        """-> the tree's tokens, parents, depth, valid, node_slots, draft_probs, and the new lengths [B]."""
        batch, width = tokens.shape
        device = tokens.device
        length = cache.length

        def head(new_tokens, new_features, cells, slots, attend, logits=False):
            return self.run_head(tokens=new_tokens, features=new_features, cells=cells, slots=slots, attend=attend,
                                 cache=cache, cfg_scale=cfg_scale, guided=guided, logits=logits)

        keys = torch.arange(length, device=device)
        slots = lengths[:, None] + torch.arange(width, device=device)  # [B, P] valid entries are a prefix
        out, _ = head(tokens, features, slots, slots, keys[None, None, :] <= slots[:, :, None])
        rows = torch.arange(batch, device=device)
        root_hidden = pack(out, guided)[rows, valid.sum(1) - 1]  # [B, F]
        # rows that stopped but stay in a compiled batch keep running their root: held at the block
        lengths = (lengths + valid.sum(1)).clamp(max=self.block)
        root_cell = lengths - 1  # [B] image index of the root
        committed = keys[None, :] < lengths[:, None]  # [B, S]
        round_slots = RoundSlots(root_hidden)
        ancestry: list[Tensor] = []  # per run: [B, n, S] round slots each node sees (itself included)

        def expand(new_tokens: Tensor, parent_slots: Tensor) -> Tensor:
            n = new_tokens.shape[1]
            depth = round_slots.child_depth(parent_slots)  # [B, n]
            first = sum(a.shape[1] for a in ancestry)
            node_slots = lengths[:, None] + first + torch.arange(n, device=device)  # [B, n]
            seen = torch.zeros(batch, n, length, dtype=torch.bool, device=device)
            if ancestry:
                previous = torch.cat(ancestry, 1)  # [B, R, S]
                parent_view = previous.gather(1, parent_slots.clamp_min(0)[:, :, None].expand(-1, -1, length))
                seen |= parent_view & (parent_slots >= 0)[:, :, None]
            seen.scatter_(2, node_slots[:, :, None], True)
            ancestry.append(seen)
            hidden, logits = head(new_tokens, round_slots.parent_hidden(parent_slots), root_cell[:, None] + depth,
                                  node_slots, committed[:, None, :] | seen, logits=True)
            round_slots.add(depth, pack(hidden, guided))
            return logits

        root_logits = combine(self.run_head.gpt.logits(unpack(root_hidden[:, None], guided)), None, cfg_scale, guided,
                              -1)[:, 0]
        tree = grow_tree(spec, roots, root_logits, expand, sampling, generators)
        return tree.tokens, tree.parents, tree.depth, tree.valid, tree.node_slots, tree.draft_probs, lengths
