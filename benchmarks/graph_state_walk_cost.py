"""Host cost of compiled mode's per-round state walk under CUDA graphs (`StateSnapshot` + `own_rebound`), played on
this CPU with `tests/graph_pool.py` (graphs through AOT autograd, so only the walk's own times mean anything).

Run: `OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/graph_state_walk_cost.py` (after `specmm zoo build
code-drafts --scale cpu`). Prints, per tree, the walk's milliseconds per round on the zoo `code` pair.
Stop 48, idle 2-core CPU, snapshot + own_rebound per round: chain k=4 0.115 + 0.185 ms (26 rounds), dynamic
(5, 4, 24) 0.128 + 0.164 ms (22 rounds).
"""

import json
import time

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import specmm
from specmm import zoo
from specmm.core import compiled
from specmm.drafters import ModelDrafter
from tests.graph_pool import graphed_on_cpu


def main() -> None:
    torch.set_num_threads(1)
    home, drafts = zoo.path("code", "cpu"), zoo.path("code-drafts", "cpu")
    target = AutoModelForCausalLM.from_pretrained(home / "target").eval()
    draft = AutoModelForCausalLM.from_pretrained(drafts / "distilled").eval()
    prompts = json.loads((home / "prompts.json").read_text())
    prompts = prompts if isinstance(prompts, list) else list(prompts.values())[0]
    first = prompts[0] if isinstance(prompts[0], str) else prompts[0]["prompt"]
    ids = AutoTokenizer.from_pretrained(home / "target")(first, return_tensors="pt").input_ids[:, :64]
    snapshot, own = compiled.StateSnapshot, compiled.own_rebound
    spent = {"snapshot": 0.0, "own": 0.0, "rounds": 0}

    def timed_snapshot(state):
        started = time.perf_counter()
        out = snapshot(state)
        spent["snapshot"] += time.perf_counter() - started
        spent["rounds"] += 1
        return out

    def timed_own(state, before):
        started = time.perf_counter()
        own(state, before)
        spent["own"] += time.perf_counter() - started

    with pytest.MonkeyPatch.context() as patch:
        graphed_on_cpu(patch)
        patch.setattr(compiled, "StateSnapshot", timed_snapshot)
        patch.setattr(compiled, "own_rebound", timed_own)
        for tree in (specmm.TreeSpec.chain(4), specmm.TreeSpec.dynamic(depth=5, top_k=4, total_tokens=24)):
            gen = specmm.SpeculativeGenerator(target, ModelDrafter(draft), tree=tree, compile=True)
            gen.generate(ids, max_new_tokens=64)  # compiles
            spent.update(snapshot=0.0, own=0.0, rounds=0)
            gen.generate(ids, max_new_tokens=128)
            rounds = spent["rounds"]
            snapshot_ms, own_ms = (1e3 * spent[k] / rounds for k in ("snapshot", "own"))
            print(f"{tree.kind} {tree.depth}: {rounds} rounds; per round snapshot {snapshot_ms:.3f} ms, "
                  f"own_rebound {own_ms:.3f} ms")


if __name__ == "__main__":
    main()
