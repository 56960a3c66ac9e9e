"""Non-finite model outputs are errors, never silent EOS or zero tokens.

NaN or inf logits (NaN in the weights, an overflow in float16, a bad input) make `argmax` return token 0 and
sampling return garbage, so a job would finish with empty captions or blank images and exit 0. Every decoding
loop therefore checks its logits and raises `NonFiniteError` naming the model and the step.

The checks are cheap: a row's maximum is NaN when any entry is NaN and +inf when any entry is +inf (and -inf
only when the whole row is), so `isfinite(logits.amax(-1))` covers the whole tensor with one reduction. Loops
that sync once per round fold the verdict into that sync (`round_flags`); loops without a per-step sync accumulate
it on the device (`FiniteWatch`) and read it once at the end.
"""

from __future__ import annotations

import torch
from torch import Tensor


HINT = ("the weights or inputs hold NaN/inf, or the dtype overflows: check the checkpoint, or run in float32")


class NonFiniteError(ValueError):
    """NaN or inf in a model's logits or outputs during decoding."""


def model_name(model) -> str:
    """What to call a model in a message: its `name_or_path` when it has one, else its class name."""
    inner = model  # an nn.Module itself, or an adapter (core Target) holding one
    if not isinstance(model, torch.nn.Module):
        inner = getattr(model, "model", None) or getattr(model, "gpt", None) or model
    for candidate in (model, inner):
        path = getattr(getattr(candidate, "config", None), "name_or_path", "")
        if path:
            return f"{type(inner).__name__} ({path})"
    return type(inner).__name__


def nonfinite_message(model, where: str, rows: list[int] | None = None, what: str = "logits") -> str:
    """'<model>: non-finite <what> (NaN or inf) at <where> (rows ...); <what to do>'."""
    on_rows = f" (rows {rows})" if rows is not None else ""
    return f"{model_name(model)}: non-finite {what} (NaN or inf) at {where}{on_rows}; {HINT}"


def nonfinite_rows(logits: Tensor) -> Tensor:
    """[B] bool: rows of logits [B, ..., V] with a NaN or inf entry (an all -inf row counts too)."""
    bad = ~torch.isfinite(logits.amax(-1))
    return bad.reshape(bad.shape[0], -1).any(-1) if bad.dim() > 1 else bad


def check_finite(values: Tensor, model, where: str, what: str = "logits") -> None:
    """Raise NonFiniteError unless every entry of `values` [B, ...] is finite (one host sync); the message
    names the model, `where` and the rows."""
    if not bool(torch.isfinite(values).all()):
        rows = None
        if values.dim():
            rows = (~torch.isfinite(values.reshape(values.shape[0], -1)).all(-1)).nonzero().flatten().tolist()
        raise NonFiniteError(nonfinite_message(model, where, rows, what))


def check_finite_steps(values: Tensor, model, what: str = "values") -> None:
    """Raise NonFiniteError unless values [B, N, ...] (N generation steps per row) are all finite, naming the
    first step with a non-finite entry (one host sync)."""
    bad = ~torch.isfinite(values.reshape(*values.shape[:2], -1)).all(-1)  # [B, N]
    if bool(bad.any()):
        step = int(bad.any(0).nonzero()[0])
        rows = bad[:, step].nonzero().flatten().tolist()
        raise NonFiniteError(nonfinite_message(model, f"generation step {step} of {values.shape[1]}", rows, what))


def round_flags(done: Tensor, logits: Tensor) -> Tensor:
    """[2] bool: any row done ([b] `done`), any row of the logits [b, T, V] non-finite."""
    return torch.stack([done.any(), nonfinite_rows(logits).any()])


def raise_nonfinite_round(logits: Tensor, model, rounds: Tensor) -> None:
    """Raise NonFiniteError for a round whose verify logits [b, T, V] are not all finite, naming the model, the round
    (`rounds`: forwards per live row so far) and the rows."""
    rows = nonfinite_rows(logits).nonzero().flatten().tolist()
    raise NonFiniteError(nonfinite_message(model, f"decoding round {int(rounds.max())}", rows))


class FiniteWatch:
    """Watches the logits of a loop without syncing: `update(logits, step)` each step (device ops only),
    `check()` once at the end raises NonFiniteError naming the first step that had a non-finite row."""

    def __init__(self, model, what: str = "step"):
        self.model, self.what = model, what
        self.first_bad: Tensor | None = None  # scalar long on the device; -1 while all is finite

    def update(self, logits: Tensor, step: int) -> None:
        bad = nonfinite_rows(logits).any()
        if self.first_bad is None:
            self.first_bad = torch.full((), -1, dtype=torch.long, device=logits.device)
        self.first_bad = torch.where(bad & (self.first_bad < 0), step, self.first_bad)

    def check(self) -> None:
        if self.first_bad is not None and int(self.first_bad) >= 0:
            raise NonFiniteError(nonfinite_message(self.model, f"{self.what} {int(self.first_bad)}"))


__all__ = ["FiniteWatch", "NonFiniteError", "check_finite", "check_finite_steps", "model_name", "nonfinite_message",
           "nonfinite_rows"]
