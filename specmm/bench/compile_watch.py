"""Count what `torch.compile` compiles while a benchmark method runs, whoever compiled it.

specmm's compiled mode reports its own compile time (`GenerationStats.compile_time_s`), but HF `generate` with a
static cache compiles through its own `torch.compile` and reports nothing. The benchmark needs one measure for
every row, so it listens to dynamo's compile callbacks (`torch._dynamo.callback.callback_handler`), which fire
around every frame dynamo compiles (inductor included) and around every CUDA-graph recording. The warm-up's
seconds are the row's compile cost; any event during a timed run means that run hit a shape the warm-up did not
compile, and the benchmark says so.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

logger = logging.getLogger(__name__)


def _handler():
    try:
        from torch._dynamo.callback import callback_handler
    except ImportError:  # a torch without dynamo callbacks: compile time goes unmeasured, never wrong
        return None
    return callback_handler


@dataclass
class CompileWatch:
    """Compile events and seconds inside `with watch:` blocks (re-entrant over calls, summed)."""

    events: int = 0
    seconds: float = 0.0
    _started: float | None = None

    def _start(self, _args) -> None:
        self._started = time.perf_counter()

    def _end(self, _args) -> None:
        if self._started is not None:
            self.seconds += time.perf_counter() - self._started
            self._started = None
        self.events += 1

    def __enter__(self) -> CompileWatch:
        handler = _handler()
        if handler is not None:
            handler.register_start_callback(self._start)
            handler.register_end_callback(self._end)
        return self

    def __exit__(self, *exc) -> None:
        handler = _handler()
        if handler is not None:
            handler.remove_start_callback(self._start)
            handler.remove_end_callback(self._end)


__all__ = ["CompileWatch"]
