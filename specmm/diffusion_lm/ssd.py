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
    """x [n, G] with tok [n, k] written at pos [n, k] where keep [n, k]."""
    return x.scatter(1, pos, torch.where(keep, tok, x.gather(1, pos)))


@torch.no_grad()
def decode_ssd(runner: Runner, x: Tensor, draft_size: int, tree_width: int, confidence: str) -> Tensor:
    p, mask_id, bl = runner.prompt_len, runner.model.mask_id, runner.block_length
    n_chain, n_leaf = draft_size, tree_width - 1
    b = x.shape[0]
    rows = torch.arange(b, device=x.device)
    logits = runner.logits(x, rows)  # [B, G, V] of the current states
    chain = torch.arange(n_chain, device=x.device)
    while rows.numel():
        n = rows.numel()
        gen = x[rows, p:]  # [n, G]
        conf, tokens = scores(logits, mask_id, confidence)
        pos, tok, valid = rank(conf, tokens, gen == mask_id, bl, n_chain + n_leaf + (n_leaf > 0), runner.cache_mode is None)
        # chain candidates [n, C, G]: candidate j commits items 0..j
        upto = chain[None, :, None] >= chain[None, None, :]  # [1, C, C]
        keep = upto & valid[:, None, :n_chain]  # [n, C, C]
        cands = _commit(gen[:, None].expand(n, n_chain, -1).reshape(n * n_chain, -1),
                        pos[:, None, :n_chain].expand(n, n_chain, n_chain).reshape(n * n_chain, -1),
                        tok[:, None, :n_chain].expand(n, n_chain, n_chain).reshape(n * n_chain, -1),
                        keep.reshape(n * n_chain, -1)).view(n, n_chain, -1)
        states = [cands]
        if n_leaf:  # leaf (j, a) = chain candidate j plus item j + 1 + a
            idx = (chain[:, None] + 1 + torch.arange(1, n_leaf + 1, device=x.device)[None]).clamp(max=pos.shape[1] - 1)
            leaf_pos, leaf_tok = pos[:, idx], tok[:, idx]  # [n, C, A]
            leaf_ok = valid[:, idx] & valid[:, :n_chain, None] & (chain[:, None] + 1 + torch.arange(
                1, n_leaf + 1, device=x.device)[None] < pos.shape[1])[None]
            flat = cands[:, :, None].expand(n, n_chain, n_leaf, -1).reshape(-1, cands.shape[-1])
            leaves = _commit(flat, leaf_pos.reshape(-1, 1), leaf_tok.reshape(-1, 1), leaf_ok.reshape(-1, 1))
            states.append(leaves.view(n, n_chain * n_leaf, -1))
        states = torch.cat(states, dim=1)  # [n, S, G] with S = C * (1 + A)
        ok = torch.cat((valid[:, :n_chain], leaf_ok.reshape(n, -1)), dim=1) if n_leaf else valid[:, :n_chain]
        run = ok & (states == mask_id).any(-1)  # complete states never need a forward
        if runner.cache_mode is not None:  # nor states that finish their block: a refresh replaces their logits
            starts = runner.block_start(torch.cat((x[rows][:, None, :p].expand(-1, states.shape[1], -1), states), -1)
                                        .flatten(0, 1)).view(n, -1)
            run &= starts == runner.cache.lengths[rows][:, None]
        # one batched forward over every candidate that needs logits
        which = run.nonzero()  # [R, 2] (row, candidate)
        full_states = torch.cat((x[rows][which[:, 0], :p], states[which[:, 0], which[:, 1]]), dim=1)  # [R, L]
        cand_logits = logits.new_zeros(n, states.shape[1], *logits.shape[1:])  # [n, S, G, V]
        if which.shape[0]:
            forward = runner.full if runner.cache_mode is None else runner.cached
            cand_logits[which[:, 0], which[:, 1]] = forward(full_states, rows[which[:, 0]])
        # acceptance: f on each candidate's own logits
        flat_states = states.reshape(n * states.shape[1], -1)
        c_conf, c_tok = scores(cand_logits.flatten(0, 1), mask_id, confidence)
        f_pos, f_tok, f_ok = (t.view(n, -1) for t in select(c_conf, c_tok, flat_states == mask_id, bl))
        f_ok = f_ok & run
        match = f_ok[:, : n_chain - 1] & valid[:, 1:n_chain] & (f_pos[:, : n_chain - 1] == pos[:, 1:n_chain]) \
            & (f_tok[:, : n_chain - 1] == tok[:, 1:n_chain])  # [n, C - 1]
        depth = match.long().cumprod(-1).sum(-1)  # [n] index of the accepted chain candidate
        accepted_idx, committed = depth, depth + 1
        if n_leaf:
            m = depth[:, None]
            base = n_chain + depth[:, None] * n_leaf + torch.arange(n_leaf, device=x.device)[None]  # [n, A]
            hit = ok.gather(1, base) & f_ok.gather(1, m) & (leaf_pos.gather(1, m[:, :, None].expand(-1, 1, n_leaf))[:, 0]
                                                            == f_pos.gather(1, m)) \
                & (leaf_tok.gather(1, m[:, :, None].expand(-1, 1, n_leaf))[:, 0] == f_tok.gather(1, m))
            leaf_hit = hit.any(-1)
            accepted_idx = torch.where(leaf_hit, base.gather(1, hit.long().argmax(-1, keepdim=True))[:, 0], depth)
            committed = committed + leaf_hit.long()
        pick = torch.arange(n, device=x.device)
        x[rows, p:] = states[pick, accepted_idx]
        logits = cand_logits[pick, accepted_idx]
        runner.stats.committed(committed)
        alive = (x[rows, p:] == mask_id).any(-1)
        rows, logits = rows[alive], logits[alive]
        if runner.cache_mode is not None and rows.numel():  # a row that entered a new block refreshes its cache
            stale = runner.block_start(x[rows]) != runner.cache.lengths[rows]
            if bool(stale.any()):
                idx = stale.nonzero()[:, 0]
                logits[idx] = runner.full(x[rows[idx]], rows[idx])
    return x
