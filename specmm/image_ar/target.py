"""Guidance-aware LlamaGen target for the core engine: one forward over the doubled batch [cond; uncond].

Both halves get the same draft tokens, tree masks and commits; logits are combined as
l_u + s (l_c - l_u) before the shared sampling order (guidance switched off past `cfg_interval`, as
upstream). Rows are ragged: row b has committed `lengths[b]` image tokens, and a round's tree nodes sit in
the cache slots right after them. The verify and the commit are modules (`GuidedVerify`, `CacheCommit`), which the
fast mode (`static_plan` set) traces into the round's graph over a cache kept across generations of the same shape;
plain decoding (`DecodeStep`) runs compiled on its own.
"""

from __future__ import annotations

import torch
from torch import Tensor

from torch import nn

from specmm.core.compiled import StaticPlan
from specmm.core.sampling import SamplingConfig, process_logits, sample_with_noise
from specmm.core.target import FEATURES, PrefillOutput, TargetOutput
from specmm.core.tree import DraftTree, ancestor_mask
from specmm.image_ar.compiled import kept_cache, part, run
from specmm.image_ar.llamagen.gpt import KVCache, LlamaGenGPT


CONDITIONING = ("conditions", "cfg_scale", "cfg_interval", "max_nodes", "caption_mask")


class GuidedTarget:
    """A core `Target` over a LlamaGen GPT. Its prompt is all conditioning: the engine gets `input_ids` of
    shape [B, 0] and the model inputs `conditions` (class ids [B] or caption embeddings [B, T, D]),
    `cfg_scale`, `cfg_interval`, `max_nodes` (largest tree to reserve cache slots for) and `caption_mask`."""

    provides = frozenset({FEATURES})

    def __init__(self, gpt: LlamaGenGPT):
        self.gpt = gpt
        self.config = gpt.config
        self.vocab_size = gpt.config.vocab_size
        self.device = gpt.tok_embeddings.weight.device
        self.tokens_per_image, self.grid_size = gpt.config.block_size, gpt.config.grid_size
        self.owner: nn.Module = gpt  # the module the image parts (compiled graphs) hang on
        self.cache: KVCache | None = None
        self.needs: frozenset[str] = frozenset()
        self.last_logits: Tensor | None = None  # [B, T, V] combined logits of the last verify (Jacobi reads them)
        self.static_plan: StaticPlan | None = None  # set by the engine (or ImageSampler) in compiled mode

    # ------------------------------------------------------------------ setup
    def start(self, batch: int, needs: frozenset[str] = frozenset()) -> None:
        unknown = set(needs) - self.provides
        if unknown:
            raise ValueError(f"drafter: needs {sorted(unknown)} which GuidedTarget does not provide")
        self.needs, self.batch, self.cache = frozenset(needs), batch, None

    def check_model_inputs(self, model_inputs: dict) -> None:
        unknown = sorted(set(model_inputs) - set(CONDITIONING))
        if unknown:
            raise ValueError(f"{', '.join(unknown)}: not an input of GuidedTarget (takes {', '.join(CONDITIONING)})")
        if "conditions" not in model_inputs:
            raise ValueError("conditions: GuidedTarget needs class ids or caption embeddings as `conditions`")

    @torch.no_grad()
    def prefill(self, input_ids: Tensor, attention_mask: Tensor, conditions: Tensor | None = None,
                cfg_scale: float = 1.0, cfg_interval: int = -1, max_nodes: int = 64,
                caption_mask: Tensor | None = None) -> PrefillOutput:
        """Prefill the condition tokens of both guidance halves (the public conditioning hook).

        input_ids: [B, 0] (there is no token before image token 0). Returns the features of the last
        condition position and the combined logits [B, V] of image token 0 as `next_logits`.
        """
        if input_ids.shape[1] != 0 or conditions is None:
            raise ValueError("input_ids: GuidedTarget takes an empty [B, 0] prompt plus `conditions`")
        if conditions.shape[0] != self.batch:
            raise ValueError(f"conditions: {conditions.shape[0]} rows for a batch of {self.batch}")
        c = self.config
        self.cfg_scale, self.cfg_interval, self.guided = float(cfg_scale), int(cfg_interval), cfg_scale > 1.0
        self.cfg_tensor = torch.tensor(self.cfg_scale, device=self.device)  # an input, so no graph per scale
        batch = conditions.shape[0]
        embeds = self.gpt.condition_embeddings(conditions)  # [B, cls, d]
        if self.guided:
            embeds = torch.cat([embeds, self.gpt.condition_embeddings(self.gpt.null_conditions(conditions))])
        rows, cls = embeds.shape[0], c.cls_token_num
        self.batch, self.max_nodes = batch, max_nodes
        self.cache = self._new_cache(rows, cls + c.block_size + max_nodes)
        length = self.cache.length
        self.key_valid = torch.ones(rows, length, dtype=torch.bool, device=self.device)  # [R, S]
        if caption_mask is not None:  # padded caption tokens are hidden from every query (both halves)
            mask = caption_mask.bool().to(self.device)
            self.key_valid[:, :cls] = torch.cat([mask, mask]) if self.guided else mask
        slots = torch.arange(cls, device=self.device)
        causal = slots[:, None] >= torch.arange(length, device=self.device)[None, :]  # [cls, S]
        attend = ((causal[None] & self.key_valid[:, None, :])
                  | (slots[:, None] == torch.arange(length, device=self.device)))
        rope = self.gpt.rope[:cls].expand(rows, -1, -1, -1)
        features = self.gpt.hidden(embeds, rope, attend[:, None], self.cache, slots.expand(rows, cls))
        self.lengths = torch.zeros(batch, dtype=torch.long, device=self.device)  # [B] committed image tokens
        predicted = torch.zeros(batch, 1, dtype=torch.long, device=self.device)
        first = combine(self.gpt.logits(features[:, -1:]), predicted, self.cfg_tensor, self.guided, self.cfg_interval)
        return PrefillOutput(features=pack(features[:, -1:], self.guided), next_logits=first[:, 0])  # [B, 1, F], [B, V]

    def _new_cache(self, rows: int, length: int) -> KVCache:
        """A fresh cache, or in compiled mode the model's kept one of this shape (`kept_cache`)."""
        ref = self.gpt.tok_embeddings.weight
        return kept_cache(self.gpt, "target", (rows, length, ref.dtype, ref.device),
                          lambda: self.gpt.new_cache(rows, length), self.static_plan)

    def close(self) -> None:
        return None

    # ------------------------------------------------------------------ rounds

    @torch.no_grad()
    def verify(self, tree: DraftTree) -> TargetOutput:
        """Run every node after each row's committed tokens; logits[:, i] predicts the token after node i."""
        nodes = tree.tokens.shape[1]
        if nodes > self.max_nodes:
            raise ValueError(f"tree: {nodes} nodes exceed the {self.max_nodes} reserved by begin(max_nodes=...)")
        logits, features = part(self.gpt, GuidedVerify)(
            tokens=tree.tokens, parents=tree.parents, depth=tree.depth, lengths=self.lengths, key_valid=self.key_valid,
                               cache=self.cache, cfg_scale=self.cfg_tensor, max_depth=tree.max_depth,
                               guided=self.guided, cfg_interval=self.cfg_interval, features=FEATURES in self.needs)
        self.last_logits = logits
        return TargetOutput(logits=logits, features=features)

    @torch.no_grad()
    def decode(self, token: Tensor, sampling: SamplingConfig, noise: Tensor | None) -> tuple[Tensor, Tensor]:
        """One plain decoding step (`DecodeStep`): run token [B], commit it, draw the next with `noise` [B, V]
        (Exp(1) draws; None when greedy). Returns the combined logits [B, V] and the next token [B]."""
        logits, token, self.lengths = run(part(self.gpt, DecodeStep), self.static_plan, token=token,
                                          lengths=self.lengths, key_valid=self.key_valid, cache=self.cache,
                                          cfg_scale=self.cfg_tensor, guided=self.guided, cfg_interval=self.cfg_interval,
                                          sampling=sampling, noise=noise)
        return logits, token

    def commit(self, path: Tensor, counts: Tensor) -> None:
        """Move the kept nodes `path[b, :counts[b]]` next to the committed tokens, on both halves."""
        self.lengths = part(self.gpt, CacheCommit)(cache=self.cache, path=path, counts=counts, lengths=self.lengths,
                                                   guided=self.guided)

    def select_rows(self, rows: Tensor) -> None:
        kept = torch.cat([rows, rows + self.batch]) if self.guided else rows
        self.cache.select_rows(kept)
        self.key_valid = self.key_valid[kept]
        self.lengths = self.lengths[rows]
        self.batch = rows.numel()
        if self.last_logits is not None:
            self.last_logits = self.last_logits[rows]


def cache_rows(x: Tensor, guided: bool) -> Tensor:
    """Per-row values [B, ...] -> cache rows [R, ...] (both guidance halves)."""
    return torch.cat([x, x]) if guided else x


def pack(features: Tensor, guided: bool) -> Tensor:
    """[R, n, d] -> [B, n, F]: cond and uncond features side by side (F = 2d when guided)."""
    return torch.cat(features.chunk(2), -1) if guided else features


def combine(logits: Tensor, predicted: Tensor, cfg_scale: Tensor, guided: bool, cfg_interval: int) -> Tensor:
    """[R, n, V] -> [B, n, V]; `predicted` [B, n] is the image index each position predicts."""
    if not guided:
        return logits
    cond, uncond = logits.chunk(2)
    mixed = uncond + (cond - uncond) * cfg_scale
    if cfg_interval < 0:
        return mixed
    return torch.where((predicted <= cfg_interval + 1)[..., None], mixed, cond)


class GuidedVerify(nn.Module):
    """One verify forward over both guidance halves: tree masks, 2-D RoPE rows, the GPT, guidance."""

    def __init__(self, gpt: LlamaGenGPT):
        super().__init__()
        self.gpt = gpt

    def forward(self, tokens: Tensor, parents: Tensor, depth: Tensor, lengths: Tensor, key_valid: Tensor,
                cache: KVCache, cfg_scale: Tensor, max_depth: int, guided: bool, cfg_interval: int,
                features: bool) -> tuple[Tensor, Tensor | None]:
        """tokens/parents/depth [B, T] of the tree, lengths [B] committed tokens -> logits [B, T, V] (and
        packed features [B, T, F] when asked)."""
        gpt, c = self.gpt, self.gpt.config
        batch, nodes = tokens.shape
        device = tokens.device
        index = lengths[:, None] + depth  # [B, T] image index of each node
        start = c.cls_token_num + lengths  # [B] first round slot
        slots = start[:, None] + torch.arange(nodes, device=device)  # [B, T]
        length = key_valid.shape[1]
        committed = torch.arange(length, device=device)[None, :] < start[:, None]  # [B, S]
        ancestors = ancestor_mask(parents, depth, max_depth)  # [B, T, T]
        in_tree = torch.zeros(batch, nodes, length, dtype=torch.bool, device=device)
        in_tree.scatter_(2, slots[:, None, :].expand(batch, nodes, nodes), ancestors)  # [B, T, S]
        attend = cache_rows(committed[:, None, :] | in_tree, guided) & key_valid[:, None, :]  # [R, T, S]
        rope_rows = c.cls_token_num + index.clamp(max=c.block_size - 1)  # nodes past the end: never kept
        rope = gpt.rope[cache_rows(rope_rows, guided)]  # [R, T, hd/2, 2]
        embeds = gpt.tok_embeddings(cache_rows(tokens, guided))
        hidden = gpt.hidden(embeds, rope, attend[:, None], cache, cache_rows(slots, guided))
        logits = combine(gpt.logits(hidden), index + 1, cfg_scale, guided, cfg_interval)
        return logits, (pack(hidden, guided) if features else None)


class CacheCommit(nn.Module):
    """Move each row's kept nodes next to its committed tokens on both halves; returns the new lengths."""

    def __init__(self, gpt: LlamaGenGPT):
        super().__init__()
        self.cls, self.block = gpt.config.cls_token_num, gpt.config.block_size

    def forward(self, cache: KVCache, path: Tensor, counts: Tensor, lengths: Tensor, guided: bool) -> Tensor:
        start = self.cls + lengths
        steps = torch.arange(path.shape[1], device=path.device)
        cache.move(cache_rows(start[:, None] + path, guided), cache_rows(start[:, None] + steps, guided))
        # live rows never pass the block (the engine cuts nodes past each row's budget); rows that stopped but stay
        # in a compiled batch keep committing their root and are held at the block, their slots junk nobody reads
        return (lengths + counts).clamp(max=self.block)


class DecodeStep(nn.Module):
    """Plain decoding: verify the last token as a one-node tree, commit it, draw the next token."""

    def __init__(self, gpt: LlamaGenGPT):
        super().__init__()
        self.verify, self.commit = part(gpt, GuidedVerify), part(gpt, CacheCommit)

    def forward(self, token: Tensor, lengths: Tensor, key_valid: Tensor, cache: KVCache, cfg_scale: Tensor,
                guided: bool, cfg_interval: int, sampling: SamplingConfig,
                noise: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        zeros = torch.zeros_like(token)[:, None]
        logits, _ = self.verify(tokens=token[:, None], parents=zeros - 1, depth=zeros, lengths=lengths,
                                key_valid=key_valid, cache=cache, cfg_scale=cfg_scale, max_depth=0, guided=guided,
                                cfg_interval=cfg_interval, features=False)
        lengths = self.commit(cache=cache, path=zeros, counts=torch.ones_like(token), lengths=lengths, guided=guided)
        logits = logits[:, 0]
        if sampling.greedy:
            return logits, logits.argmax(-1), lengths
        return logits, sample_with_noise(process_logits(logits, sampling), noise), lengths
