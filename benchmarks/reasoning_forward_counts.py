"""How many forwards each model runs in `bench reasoning`'s rows, and how many rows a target forward carries: counts,
not times, so it runs anywhere (zoo `chainarith`, cpu build, the bench's problems and limits).

Run: `python benchmarks/reasoning_forward_counts.py 64 128` (batch, problems). With the fixed and per-token costs of
`reasoning_token_cost_probe.py` these counts say where a row's time goes.
"""

import sys

import torch

from specmm import zoo
from specmm.reasoning import StepSpeculator
from specmm.reasoning.policies import Arbitrage, TargetOnly
from specmm.zoo import chainarith


def main() -> None:
    torch.set_num_threads(1)
    batch, count = int(sys.argv[1]), int(sys.argv[2])
    models = chainarith.load(zoo.path("chainarith", "cpu"))
    prompts = [p.prompt for p in models.heldout_problems(count)]
    rows = [("target-only", TargetOnly(), "lockstep"), ("arbitrage(t=0.5)", Arbitrage(models.router, 0.5), "lockstep"),
            ("arbitrage(t=0.5)", Arbitrage(models.router, 0.5), "async"),
            ("arbitrage(t=0.05)", Arbitrage(models.router, 0.05), "async")]
    print(f"batch {batch}, {count} problems, greedy, max_new_tokens 96, max_step_tokens 12")
    print("| row | schedule | new tokens | draft token share | target forwards | rows per target forward "
          "| target forwards / target-only's | draft forwards |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    reference = None
    for name, policy, schedule in rows:
        spec = StepSpeculator(models.target, models.draft, models.tokenizer, policy,
                              delimiter=[models.step_token_id], max_step_tokens=12)
        out = spec.generate(prompts, max_new_tokens=96, seed=0, batch_size=batch, schedule=schedule,
                            refill=schedule == "async")
        stats = out.stats
        forwards = stats.target_forwards
        reference = reference or forwards
        per_forward = sum(stats.target_forwards_per_row) / forwards
        share = stats.reasoning.draft_tokens / stats.new_tokens if stats.reasoning else 0.0
        print(f"| {name} | {schedule} | {stats.new_tokens} | {share:.2f} | {forwards} | {per_forward:.1f} "
              f"| {forwards / reference:.2f} | {stats.draft_forwards} |")


if __name__ == "__main__":
    main()
