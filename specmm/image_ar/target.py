"""Guidance-aware LlamaGen target for the core engine: one forward over the doubled batch [cond; uncond].

Both halves get the same draft tokens, tree masks and commits; logits are combined as
l_u + s (l_c - l_u) before the shared sampling order (guidance switched off past `cfg_interval`, as
upstream). Rows are ragged: row b has committed `lengths[b]` image tokens, and a round's tree nodes sit in
the cache slots right after them.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specmm.core.target import FEATURES, PrefillOutput, TargetOutput
from specmm.core.tree import DraftTree
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
        self.cache: KVCache | None = None
        self.needs: frozenset[str] = frozenset()
        self.last_logits: Tensor | None = None  # [B, T, V] combined logits of the last verify (Jacobi reads them)

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
        batch = conditions.shape[0]
        embeds = self.gpt.condition_embeddings(conditions)  # [B, cls, d]
        if self.guided:
            embeds = torch.cat([embeds, self.gpt.condition_embeddings(self.gpt.null_conditions(conditions))])
        rows, cls = embeds.shape[0], c.cls_token_num
        self.batch, self.max_nodes = batch, max_nodes
        self.cache = self.gpt.new_cache(rows, cls + c.block_size + max_nodes)
        length = self.cache.length
        self.key_valid = torch.ones(rows, length, dtype=torch.bool, device=self.device)  # [R, S]
        if caption_mask is not None:  # padded caption tokens are hidden from every query (both halves)
            mask = caption_mask.bool().to(self.device)
            self.key_valid[:, :cls] = torch.cat([mask, mask]) if self.guided else mask
        slots = torch.arange(cls, device=self.device)
        causal = slots[:, None] >= torch.arange(length, device=self.device)[None, :]  # [cls, S]
        attend = (causal[None] & self.key_valid[:, None, :]) | (slots[:, None] == torch.arange(length, device=self.device))
        rope = self.gpt.rope[:cls].expand(rows, -1, -1, -1)
        features = self.gpt.hidden(embeds, rope, attend[:, None], self.cache, slots.expand(rows, cls))
        self.lengths = torch.zeros(batch, dtype=torch.long, device=self.device)  # [B] committed image tokens
        first = self._combine(self.gpt.logits(features[:, -1:]),
                              torch.zeros(batch, 1, dtype=torch.long, device=self.device))[:, 0]
        return PrefillOutput(features=self._pack(features[:, -1:]), next_logits=first)  # [B, 1, F], [B, V]

    def close(self) -> None:
        return None

    # ------------------------------------------------------------------ rounds
    def _rows(self, x: Tensor) -> Tensor:
        """Per-row values [B, ...] -> cache rows [R, ...] (both guidance halves)."""
        return torch.cat([x, x]) if self.guided else x

    def _pack(self, features: Tensor) -> Tensor:
        """[R, n, d] -> [B, n, F]: cond and uncond features side by side (F = 2d when guided)."""
        return torch.cat(features.chunk(2), -1) if self.guided else features

    def _combine(self, logits: Tensor, predicted: Tensor) -> Tensor:
        """[R, n, V] -> [B, n, V]; `predicted` [B, n] is the image index each position predicts."""
        if not self.guided:
            return logits
        cond, uncond = logits.chunk(2)
        guided = uncond + (cond - uncond) * self.cfg_scale
        if self.cfg_interval < 0:
            return guided
        return torch.where((predicted <= self.cfg_interval + 1)[..., None], guided, cond)

    @torch.no_grad()
    def verify(self, tree: DraftTree) -> TargetOutput:
        """Run every node after each row's committed tokens; logits[:, i] predicts the token after node i."""
        c = self.config
        batch, nodes = tree.tokens.shape
        if nodes > self.max_nodes:
            raise ValueError(f"tree: {nodes} nodes exceed the {self.max_nodes} reserved by begin(max_nodes=...)")
        index = self.lengths[:, None] + tree.depth  # [B, T] image index of each node
        start = c.cls_token_num + self.lengths  # [B] first round slot
        slots = start[:, None] + torch.arange(nodes, device=self.device)  # [B, T]
        length = self.cache.length
        keys = torch.arange(length, device=self.device)
        committed = keys[None, :] < start[:, None]  # [B, S]
        in_tree = torch.zeros(batch, nodes, length, dtype=torch.bool, device=self.device)
        in_tree.scatter_(2, slots[:, None, :].expand(batch, nodes, nodes), tree.ancestors)  # [B, T, S]
        attend = self._rows(committed[:, None, :] | in_tree) & self.key_valid[:, None, :]  # [R, T, S]
        rope_rows = c.cls_token_num + index.clamp(max=c.block_size - 1)  # nodes past the end: never kept
        rope = self.gpt.rope[self._rows(rope_rows)]  # [R, T, hd/2, 2]
        embeds = self.gpt.tok_embeddings(self._rows(tree.tokens))
        features = self.gpt.hidden(embeds, rope, attend[:, None], self.cache, self._rows(slots))
        logits = self._combine(self.gpt.logits(features), index + 1)
        self.last_logits = logits
        return TargetOutput(logits=logits, features=self._pack(features) if FEATURES in self.needs else None)

    def commit(self, path: Tensor, counts: Tensor) -> None:
        """Move the kept nodes `path[b, :counts[b]]` next to the committed tokens, on both halves."""
        start = self.config.cls_token_num + self.lengths
        steps = torch.arange(path.shape[1], device=self.device)
        self.cache.move(self._rows(start[:, None] + path), self._rows(start[:, None] + steps))
        self.lengths = self.lengths + counts

    def select_rows(self, rows: Tensor) -> None:
        cache_rows = torch.cat([rows, rows + self.batch]) if self.guided else rows
        self.cache.select_rows(cache_rows)
        self.key_valid = self.key_valid[cache_rows]
        self.lengths = self.lengths[rows]
        self.batch = rows.numel()
        if self.last_logits is not None:
            self.last_logits = self.last_logits[rows]
