"""Compiled mode of the image sampler (`ImageSampler(compile=True)`).

Each pure tensor part of a round is an `nn.Module` (the guided verify and the cache commit in `target`, the
Jacobi draft in `jacobi`, the drafter head run in `drafter`, the acceptance walk here). Eager mode calls them
directly; compiled mode runs them through `specmm.core.compiled.compiled_forward` (static shapes per window or
tree size, one graph per shape, shared by every sampler of the model; eager with one warning naming the reason
if a part cannot compile). Random draws are made eagerly before a part runs, in eager mode's order, so both
modes give the same tokens, and nothing in a part reads a tensor on the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from specmm.core.acceptance import AcceptanceRule, AcceptResult, accept_greedy, accept_sampled, sampled_draws
from specmm.core.compiled import StaticPlan, compile_failure, compiled_forward
from specmm.core.sampling import Generators, SamplingConfig, process_logits
from specmm.core.tree import DraftTree, ancestor_mask, children_table


def image_plan(device: torch.device) -> StaticPlan:
    """The plan of an image generation: LlamaGen's own static caches, compiled parts (CUDA graphs on CUDA)."""
    return StaticPlan(max_len=0, compile=True, mode="reduce-overhead" if torch.device(device).type == "cuda" else None)


def part(owner: nn.Module, kind: type[nn.Module], *args) -> nn.Module:
    """The one `kind(owner, *args)` module of `owner`, kept on it so every sampler of the model shares its graphs."""
    parts = owner.__dict__.setdefault("_specmm_image_parts", {})  # not a registered submodule: no state_dict change
    if kind not in parts:
        parts[kind] = kind(owner, *args)
    return parts[kind]


def run(module: nn.Module, plan: StaticPlan | None, **inputs):
    """`module(**inputs)`, through its compiled forward when `plan` compiles."""
    if plan is None or not plan.compile:
        return module(**inputs)
    return compiled_forward(module, plan.mode)(**inputs)


def static_buffers(tensors: list[Tensor], plan: StaticPlan | None) -> None:
    """Mark cache buffers a compiled part writes in place as static (CUDA graphs keep their addresses)."""
    if plan is not None and plan.compile and plan.mode is not None:
        for tensor in tensors:
            torch._dynamo.mark_static_address(tensor)


class AcceptWalk(nn.Module):
    """The acceptance walk of one round: greedy, or sampled from draws made beforehand."""

    def __init__(self, owner: nn.Module | None = None):
        super().__init__()

    def forward(self, tokens: Tensor, parents: Tensor, depth: Tensor, valid: Tensor, draft_probs: Tensor | None,
                logits: Tensor, coins: Tensor | None, noise: Tensor | None, max_depth: int, max_children: int,
                sampling: SamplingConfig, rule: AcceptanceRule):
        tree = TracedTree(tokens=tokens, parents=parents, depth=depth, valid=valid, max_depth=max_depth,
                          max_children=max_children, draft_probs=draft_probs,
                          ancestors=ancestor_mask(parents, depth, max_depth),
                          children=children_table(parents, valid, max_children))
        if sampling.greedy:
            result = accept_greedy(tree, logits, rule)
        else:
            result = accept_sampled(tree, process_logits(logits, sampling), rule, draws=(coins, noise))
        return result.path, result.num_accepted, result.next_token, result.diagnostics


@dataclass
class TracedTree(DraftTree):
    """A DraftTree with its ancestor and child tables as plain fields: dynamo cannot trace `cached_property`."""

    ancestors: Tensor | None = None  # [B, T, T]
    children: Tensor | None = None  # [B, T, C]


_WALK = AcceptWalk()


class CompiledRule:
    """An acceptance rule whose whole tree walk runs compiled (the engine's `accept` calls `accept_tree`);
    every other attribute is the wrapped rule's."""

    def __init__(self, rule: AcceptanceRule, plan: StaticPlan):
        self.rule, self.plan = rule, plan

    def __getattr__(self, name: str):
        return getattr(self.__dict__["rule"], name)

    def accept_tree(self, tree: DraftTree, target_logits: Tensor, sampling: SamplingConfig,
                    generators: Generators = None) -> AcceptResult:
        coins = noise = None
        if not sampling.greedy:
            coins, noise = sampled_draws(tree, target_logits.shape[-1], generators, target_logits.device)
        path, num_accepted, next_token, diagnostics = run(
            _WALK, self.plan, tokens=tree.tokens, parents=tree.parents, depth=tree.depth, valid=tree.valid,
            draft_probs=tree.draft_probs, logits=target_logits, coins=coins, noise=noise, max_depth=tree.max_depth,
            max_children=tree.max_children, sampling=sampling, rule=self.rule)
        return AcceptResult(path=path, num_accepted=num_accepted, next_token=next_token, diagnostics=dict(diagnostics))


def compile_failures(*owners: nn.Module | None) -> list[str]:
    """Why parts of `owners` (a GPT, a drafter head) or the acceptance walk could not compile ([] when all did)."""
    parts = [_WALK] + [p for o in owners if o is not None for p in o.__dict__.get("_specmm_image_parts", {}).values()]
    reasons = [(type(p).__name__, compile_failure(p)) for p in parts]
    return [f"{name}: {why}" for name, why in reasons if why is not None]


__all__ = ["AcceptWalk", "CompiledRule", "compile_failures", "image_plan", "part", "run", "static_buffers"]
