"""Eager `SSMTarget.prefill` of the zoo `ssm-code` (cpu build) prompts, batch 4, 1 thread: minimum of 5 calls after
3 warm-ups, then the ops that took the most time (torch.profiler).

Run: `python benchmarks/ssm_prefill_probe.py hybrid` (or `mamba2`). Quoted (stop 37, hybrid, 4 x 64 tokens): 119-123 ms
at b362e8f^, where aten::exp of [4, 12, 63, 63] decays took 17 ms (subnormal results), against 88-92 ms at b362e8f;
68.8 ms at f0c2748 in a faster spell of the machine (no before-run in that spell).
"""

import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from specmm import zoo
from specmm.ssm import SSMTarget
from specmm.zoo import ssm_code


def main() -> None:
    torch.set_num_threads(1)
    target_model, tokenizer, prompts = ssm_code.load(zoo.path("ssm-code", "cpu"), sys.argv[1])
    batch = tokenizer(prompts[:4], return_tensors="pt", padding=True)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    target = SSMTarget(target_model)

    def run() -> float:
        target.start(ids.shape[0])
        started = time.perf_counter()
        target.prefill(ids[:, :-1], mask[:, :-1])
        seconds = time.perf_counter() - started
        target.close()
        return seconds

    with torch.no_grad():
        for _ in range(3):
            run()
        print(f"prefill {min(run() for _ in range(5)) * 1e3:.1f} ms")
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            run()
    print(prof.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=12))


if __name__ == "__main__":
    main()
