"""What a user waits before the first fast token: the fast mode's first generation of the zoo `code` pair, cold.

Runs in a fresh process with an empty inductor cache (as on a new machine), for each row: the first generation
(compiles), then a second one of the same shapes (compiles nothing), both greedy, checked against eager mode's
tokens. Reports the first generation's wall time, the compile seconds the engine counted, the graphs dynamo made,
and the warm generation's wall time.

    python benchmarks/fast_mode_warmup.py --scale cpu --batch 1 --out benchmarks/fast-mode-warmup-cpu.md
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", default="cpu")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None, help="markdown report (default: print only)")
    args = parser.parse_args()
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="specmm-warmup-")  # cold, before torch loads
    import torch

    import specmm
    from specmm.bench.inputs import from_zoo
    from specmm.core.compiled import graphs_compiled
    from specmm.drafters import ModelDrafter

    torch.set_num_threads(args.threads)
    data = from_zoo("code", args.scale, args.batch, "cpu", torch.float32)
    rows = [("chain k=2", specmm.TreeSpec.chain(2), lambda: ModelDrafter(data.draft)),
            ("tree dynamic(3, 2, 8)", specmm.TreeSpec.dynamic(depth=3, top_k=2, total_tokens=8),
             lambda: ModelDrafter(data.draft))]
    kwargs = dict(attention_mask=data.attention_mask, max_new_tokens=args.max_new_tokens,
                  pad_token_id=data.pad_token_id, eos_token_id=[])
    lines = ["| row | first generation s | compile s (engine) | graphs | warm generation s | outputs match eager |",
             "|---|---:|---:|---:|---:|:---:|"]
    for name, tree, drafter in rows:
        eager = specmm.SpeculativeGenerator(data.target, drafter(), tree=tree).generate(data.input_ids, **kwargs)
        fast = specmm.SpeculativeGenerator(data.target, drafter(), tree=tree, compile=True)
        graphs, started = graphs_compiled(), time.perf_counter()
        first = fast.generate(data.input_ids, **kwargs)
        first_s, made = time.perf_counter() - started, graphs_compiled() - graphs
        started = time.perf_counter()
        warm = fast.generate(data.input_ids, **kwargs)
        warm_s = time.perf_counter() - started
        match = torch.equal(first.sequences, eager.sequences) and torch.equal(warm.sequences, eager.sequences)
        lines.append(f"| {name} | {first_s:.1f} | {first.stats.compile_time_s:.1f} | {made} | {warm_s:.2f} | "
                     f"{'yes' if match else 'NO'} |")
        print(lines[-1], flush=True)
    report = "\n".join([
        "# The fast mode's warm-up, cold", "",
        f"Command: `python {' '.join(sys.argv)}`  ", "",
        *lines, "",
        f"Zoo `code` ({args.scale}), batch {args.batch}, {args.max_new_tokens} new tokens, greedy, float32, "
        f"{args.threads} threads, an empty inductor cache. Rows run in this order in one process: the first "
        "also pays inductor's one-time start-up, and the second may reuse kernels the first compiled.", "",
        f"torch {torch.__version__}, python {platform.python_version()}, {os.cpu_count()} CPUs.", ""])
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(report)
    print(report)


if __name__ == "__main__":
    main()
