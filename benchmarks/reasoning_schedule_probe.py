"""Step-level speculation on the zoo `chainarith` (cpu build), 1 thread: wall time of whole `StepSpeculator.generate`
calls per row kind and schedule, each the minimum over alternating passes in one process.

Run: `python benchmarks/reasoning_schedule_probe.py 64 target-lock,arb-lock,arb-async 128` (batch, rows, problems).
Rows: target-lock, target-async, arb-lock, arb-async (Arbitrage t=0.5), sr-lock, sr-async (SpecReason t=6).
`--slots-ab`: target-only lockstep with the adapters' per-row buffers (`row_slots`) on and off, alternating.
Figures quoted from it (stop 37): SpecReason async 5.72-5.82 s at df4c7ff^ against 5.34-5.37 s at df4c7ff; with
`--slots-ab` at df4c7ff, target-only lockstep 2.59-2.65 s with row_slots against 2.79-2.92 s without; again at
f0c2748 (a faster spell of the machine): 2.37-2.47 s against 2.45-2.58 s, and Arbitrage lockstep 3.69 s, async 3.88 s.
"""

import sys
import time

import torch

from specmm import zoo
from specmm.bench.reasoning import JUDGE
from specmm.core.target import RunnerOwner
from specmm.reasoning import JudgeTemplate, StepSpeculator
from specmm.reasoning.policies import Arbitrage, SpecReason, TargetOnly
from specmm.zoo import chainarith


def main() -> None:
    torch.set_num_threads(1)
    batch, names, count = int(sys.argv[1]), sys.argv[2].split(","), int(sys.argv[3])
    models = chainarith.load(zoo.path("chainarith", "cpu"))
    prompts = [p.prompt for p in models.heldout_problems(count)]
    template = JudgeTemplate.from_text(models.tokenizer, JUDGE)

    def spec(policy):
        return StepSpeculator(models.target, models.draft, models.tokenizer, policy,
                              delimiter=[models.step_token_id], max_step_tokens=12)

    policies = {"target": TargetOnly(), "arb": Arbitrage(models.router, 0.5),
                "sr": SpecReason(6, template=template, method="expected")}

    def run(name: str) -> float:
        kind, schedule = name.split("-")
        started = time.perf_counter()
        spec(policies[kind]).generate(prompts, max_new_tokens=96, seed=0, batch_size=batch,
                                      schedule="async" if schedule == "async" else "lockstep",
                                      refill=schedule == "async")
        return time.perf_counter() - started

    if "--slots-ab" in sys.argv:
        times = {True: [], False: []}
        for _ in range(4):
            for slots in (True, False):  # ModelState.start sets row_slots; this property ignores it
                RunnerOwner.row_slots = property(lambda self, s=slots: s, lambda self, value: None)
                times[slots].append(run("target-lock"))
        print({f"row_slots={k}": [round(t, 2) for t in v] for k, v in times.items()})
        return
    for name in names:
        run(name)  # warm-up
    best = {name: min(run(name) for _ in range(2)) for name in names}
    for name, seconds in best.items():
        print(f"{name:14s} {seconds:.2f} s")


if __name__ == "__main__":
    main()
