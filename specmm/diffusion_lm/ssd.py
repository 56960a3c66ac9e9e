"""Self-speculative decoding (SSD): draft several (position, token) commits from one forward, verify the
partial states in one batched forward, keep the longest prefix stepwise decoding would have taken.

Draft items d_1..d_M are the state's ranking (block, then confidence, then position); d_1 = f(state). Chain
candidate c_j commits d_1..d_j. Candidate c_j accepts c_{j+1} iff f(c_j) = d_{j+1}, computed from c_j's own
logits, so every accepted state is a state of the stepwise trajectory (lossless by induction). With tree
width w > 1 each chain node also gets w - 1 leaf children (c_j plus d_{j+1+a}, a = 1..w-1): when the
chain stops at c_m and f(c_m) is one of its leaves, that leaf is accepted too. The accepted state's
logits seed the next draft, so an iteration costs one forward (plus a cache refresh at block starts).
"""

from __future__ import annotations

import torch
from torch import Tensor

from specmm.diffusion_lm.runner import Runner
from specmm.diffusion_lm.selection import rank, scores, select


def _commit(x: Tensor, pos: Tensor, tok: Tensor, keep: Tensor) -> Tensor:
    """x [n, G] with tok [n, k] written at pos [n, k] where keep [n, k] (kept positions are distinct; the others
    may repeat them, as `rank` pads a draft longer than the masks, and must not write: so no scatter of old
    values, whose order on repeated indices is undefined)."""
    hits = torch.zeros_like(x).scatter_add(1, pos, keep.long())  # [n, G] 1 where an item is kept
    values = torch.zeros_like(x).scatter_add(1, pos, torch.where(keep, tok, 0))  # [n, G] its token
    return torch.where(hits > 0, values, x)


def _candidates(gen: Tensor, pos: Tensor, tok: Tensor, valid: Tensor, n_chain: int, n_leaf: int
                ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Candidate states [n, S, G] (S = C chains then C * A leaves), their validity [n, S], and the items
    each node's leaves add: positions and tokens [n, C, A]."""
    n, g = gen.shape
    chain = torch.arange(n_chain, device=gen.device)
    keep = (chain[:, None] >= chain[None, :])[None] & valid[:, None, :n_chain]  # [n, C, C]: j commits items 0..j
    cands = _commit(gen[:, None].expand(n, n_chain, g).reshape(-1, g),
                    pos[:, None, :n_chain].expand(n, n_chain, n_chain).reshape(n * n_chain, -1),
                    tok[:, None, :n_chain].expand(n, n_chain, n_chain).reshape(n * n_chain, -1),
                    keep.reshape(n * n_chain, -1)).view(n, n_chain, g)
    item = chain[:, None] + 1 + torch.arange(1, n_leaf + 1, device=gen.device)[None]  # [C, A] leaf (j, a) adds j+1+a
    inside = item < pos.shape[1]
    item = item.clamp(max=pos.shape[1] - 1)
    leaf_pos, leaf_tok = pos[:, item], tok[:, item]  # [n, C, A]
    leaf_ok = valid[:, item] & valid[:, :n_chain, None] & inside[None]
    leaves = _commit(cands[:, :, None].expand(n, n_chain, n_leaf, g).reshape(-1, g), leaf_pos.reshape(-1, 1),
                     leaf_tok.reshape(-1, 1), leaf_ok.reshape(-1, 1)).view(n, n_chain * n_leaf, g)
    ok = torch.cat((valid[:, :n_chain], leaf_ok.reshape(n, -1)), dim=1)
    return torch.cat((cands, leaves), dim=1), ok, leaf_pos, leaf_tok


def _accept(f_pos: Tensor, f_tok: Tensor, f_ok: Tensor, pos: Tensor, tok: Tensor, valid: Tensor, ok: Tensor,
            leaf_pos: Tensor, leaf_tok: Tensor, n_chain: int, n_leaf: int) -> tuple[Tensor, Tensor]:
    """(index of the accepted candidate [n], tokens committed [n]) from f of every candidate [n, S]."""
    match = f_ok[:, : n_chain - 1] & valid[:, 1:n_chain] & (f_pos[:, : n_chain - 1] == pos[:, 1:n_chain]) \
        & (f_tok[:, : n_chain - 1] == tok[:, 1:n_chain])  # [n, C - 1]: c_j's choice is the chain's next item
    depth = match.long().cumprod(-1).sum(-1)  # [n] deepest accepted chain candidate
    if not n_leaf:
        return depth, depth + 1
    m = depth[:, None]  # [n, 1]
    base = n_chain + m * n_leaf + torch.arange(n_leaf, device=depth.device)[None]  # [n, A] its leaves
    node = m[:, :, None].expand(-1, 1, n_leaf)
    hit = ok.gather(1, base) & f_ok.gather(1, m) & (leaf_pos.gather(1, node)[:, 0] == f_pos.gather(1, m)) \
        & (leaf_tok.gather(1, node)[:, 0] == f_tok.gather(1, m))  # [n, A]
    leaf_hit = hit.any(-1)
    index = torch.where(leaf_hit, base.gather(1, hit.long().argmax(-1, keepdim=True))[:, 0], depth)
    return index, depth + 1 + leaf_hit.long()


@torch.no_grad()
def decode_ssd(runner: Runner, x: Tensor, draft_size: int, tree_width: int, confidence: str) -> Tensor:
    p, mask_id, bl = runner.prompt_len, runner.model.mask_id, runner.block_length
    n_chain, n_leaf = draft_size, tree_width - 1
    rows = torch.arange(x.shape[0], device=x.device)
    conf, tokens = scores(runner.logits(x, rows), mask_id, confidence)  # [B, G] of the current states
    while rows.numel():
        n = rows.numel()
        gen = x[rows, p:]  # [n, G]
        pos, tok, valid = rank(conf, tokens, gen == mask_id, bl, n_chain + n_leaf + (n_leaf > 0),
                               runner.cache_mode is None)  # [n, M] draft items
        states, ok, leaf_pos, leaf_tok = _candidates(gen, pos, tok, valid, n_chain, n_leaf)  # [n, S, G]
        run = ok & (states == mask_id).any(-1)  # complete states never need a forward
        prompts = x[rows, :p][:, None].expand(-1, states.shape[1], -1)  # [n, S, P]
        if runner.cache_mode is not None:  # nor states that finish their block: a refresh replaces their logits
            starts = runner.block_start(torch.cat((prompts, states), -1).flatten(0, 1)).view(n, -1)
            run &= starts == runner.cache.lengths[rows][:, None]
        # one batched forward over every candidate that needs logits; only its scores are kept
        which = run.nonzero()  # [R, 2] (row, candidate)
        c_conf = conf.new_zeros(n, states.shape[1], states.shape[2])  # [n, S, G]
        c_tok = tokens.new_zeros(n, states.shape[1], states.shape[2])
        if which.shape[0]:
            forward = runner.full if runner.cache_mode is None else runner.cached
            full = torch.cat((prompts[which[:, 0], which[:, 1]], states[which[:, 0], which[:, 1]]), dim=1)  # [R, L]
            c_conf[which[:, 0], which[:, 1]], c_tok[which[:, 0], which[:, 1]] = scores(
                forward(full, rows[which[:, 0]]), mask_id, confidence)
        # acceptance: f of each candidate from its own logits
        f_pos, f_tok, f_ok = (t.view(n, -1) for t in select(c_conf.flatten(0, 1), c_tok.flatten(0, 1),
                                                             states.flatten(0, 1) == mask_id, bl))
        index, committed = _accept(f_pos, f_tok, f_ok & run, pos, tok, valid, ok, leaf_pos, leaf_tok,
                                   n_chain, n_leaf)
        pick = torch.arange(n, device=x.device)
        x[rows, p:] = states[pick, index]
        conf, tokens = c_conf[pick, index], c_tok[pick, index]
        runner.committed(committed)
        alive = (x[rows, p:] == mask_id).any(-1)
        rows, conf, tokens = rows[alive], conf[alive], tokens[alive]
        if runner.cache_mode is not None and rows.numel():  # a row that entered a new block refreshes its cache
            stale = runner.block_start(x[rows]) != runner.cache.lengths[rows]
            if bool(stale.any()):
                idx = stale.nonzero()[:, 0]
                conf[idx], tokens[idx] = scores(runner.full(x[rows[idx]], rows[idx]), mask_id, confidence)
    return x
