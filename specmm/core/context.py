"""A model's context length, and whether a prompt plus its generation budget fits in it.

Positions past the context are not an error in most HF models: rotary models run on with degraded outputs,
learned position tables index out of range, and a huge prompt allocates its attention matrix before anything
fails. Batch jobs check every item first (`context_problem`) and turn an item that cannot fit into an error
record, so its batch-mates run as usual.
"""

from __future__ import annotations

from torch import nn

CONTEXT_FIELDS = ("max_position_embeddings", "max_sequence_length", "n_positions", "seq_length")


def context_limit(model: nn.Module) -> int | None:
    """Positions the model can attend over (its text config's `max_position_embeddings` or equivalent); None
    when the config does not say."""
    config = getattr(model, "config", None)
    if config is None:
        return None
    if hasattr(config, "get_text_config"):
        config = config.get_text_config()
    for name in CONTEXT_FIELDS:
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def context_problem(prompt_tokens: int, max_new_tokens: int, limit: int | None, extra: int = 0,
                    extra_what: str = "draft tree depth") -> str | None:
    """Why `prompt_tokens + max_new_tokens + extra` positions do not fit in `limit` (None when they do, or when
    the limit is unknown). `extra` covers what a round may write past the budget (the draft tree's depth, a
    judge prompt, ...)."""
    if limit is None or prompt_tokens + max_new_tokens + extra <= limit:
        return None
    return (f"prompt of {prompt_tokens} tokens + max_new_tokens {max_new_tokens} + {extra} ({extra_what}) = "
            f"{prompt_tokens + max_new_tokens + extra} positions exceeds the model's context of {limit}; shorten the "
            "prompt or lower max_new_tokens")


def check_budget(max_new_tokens: int, limit: int | None, argument: str = "max_new_tokens", extra: int = 0) -> None:
    """ValueError when `max_new_tokens` (+ `extra`) alone leaves no room for a prompt in the context."""
    if limit is not None and max_new_tokens + extra >= limit:
        raise ValueError(f"{argument}: {max_new_tokens} new tokens (+ {extra} for drafts) leave no room for a "
                         f"prompt in the model's context of {limit} positions; use at most {limit - extra - 1}")


__all__ = ["check_budget", "context_limit", "context_problem"]
