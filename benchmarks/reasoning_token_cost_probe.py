"""What a target token costs read in a block against decoded one at a time, on the zoo `chainarith` target shape.

Step-level speculation (SpecReason, Arbitrage) saves target time only if the target reads a kept draft step (one
forward over its tokens) for less than it would spend decoding them (one forward per token). This probe measures
both through the adapter the step speculator uses (`HFCausalLMTarget` over per-row slot buffers, eager), from the
same committed context, on a randomly initialised target of the zoo's `cpu` recipe shape (cost does not depend on
the weights):

- decode: `step` forwards of one new token per row;
- read: one forward of `step` new tokens per row.

ratio = read / decode time: what a kept step's token costs against a decoded one. With a fraction `a` of a row's
tokens kept from the draft and the rest decoded by the target, the target alone already takes `a * ratio + 1 - a`
of target-only's time (draft forwards, discarded draft tokens and judging only add to it), so
speedup <= 1 / (a * ratio + 1 - a) ("target forwards free": the bound for any schedule, however it batches).

A forward also has a fixed cost (framework overhead per layer, measured as a one-row, one-token forward). The
asynchronous schedule runs the target in every iteration in which some row reads or regenerates, which at batch
64 is nearly every one, and a drafting row writes one token per iteration: so the target runs at least as many
forwards as target-only, each paying the fixed cost, and only the rest of a forward's cost shrinks with a. That
bound is the last column.

Run: `OMP_NUM_THREADS=1 python benchmarks/reasoning_token_cost_probe.py` (threads 1, as `bench reasoning`).
`--hf-generate`: instead, HF `generate`'s time per decode step on the same target, eager and with a static cache plus
`torch.compile` (the plain decoding the other benches take as their best baseline; `bench reasoning` has no such row).
"""

import argparse
import time

import torch

from specmm.core.target import HFCausalLMTarget
from specmm.zoo import chainarith
from specmm.zoo.chainarith_task import make_tokenizer


def timed(target: HFCausalLMTarget, batch: int, tokens: torch.Tensor, per_forward: int) -> float:
    """Seconds to run `tokens` [B, n] as open chains of `per_forward` tokens, each kept; then forget them."""
    count = tokens.shape[1]
    started = time.perf_counter()
    for start in range(0, count, per_forward):
        block = tokens[:, start:start + per_forward]
        target.open_chain(block, torch.ones_like(block, dtype=torch.bool))
        target.keep_chain(torch.full((batch,), block.shape[1]))
    seconds = time.perf_counter() - started
    target.rewind(torch.full((batch,), count))
    return seconds


def hf_generate_step_ms(model, vocab: int, batch: int, context: int, **kwargs) -> float:
    """HF `generate`'s milliseconds per decode step: (33 new tokens - 1 new token) / 32, the best of 5."""
    ids = torch.randint(4, vocab, (batch, context), generator=torch.Generator().manual_seed(batch))

    def seconds(new: int) -> float:
        started = time.perf_counter()
        model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new,
                       min_new_tokens=new, pad_token_id=0, **kwargs)
        return time.perf_counter() - started

    seconds(33), seconds(1)  # warm-up (and the compile)
    return 1e3 * min((seconds(33) - seconds(1)) / 32 for _ in range(5))


def hf_generate_rows(model, vocab: int, batch_sizes: list[int], context: int) -> None:
    from specmm.bench.fast_path import hf_compile_scope, hf_static_compile_kwargs

    print("| batch | HF generate eager, ms per step | HF generate, static cache + torch.compile, ms per step |")
    print("|---:|---:|---:|")
    for batch in batch_sizes:
        eager = hf_generate_step_ms(model, vocab, batch, context)
        with hf_compile_scope(model):
            compiled = hf_generate_step_ms(model, vocab, batch, context, **hf_static_compile_kwargs(model))
        print(f"| {batch} | {eager:.2f} | {compiled:.2f} |")


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--context", type=int, default=48, help="committed tokens per row before the step")
    parser.add_argument("--step", type=int, default=12, help="tokens in a step (bench reasoning: max_step_tokens)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--hf-generate", action="store_true", help="HF generate's step times instead")
    parser.add_argument("--shares", type=float, nargs="+", default=[0.31, 0.58, 1.0],
                        help="draft token shares a to bound (defaults: Arbitrage t=0.05 and t=0.5 at batch 64)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    tokenizer = make_tokenizer()
    model = chainarith.make_model(chainarith.RECIPES["cpu"]["target"], tokenizer, seed=0).eval()
    vocab = len(tokenizer)
    if args.hf_generate:
        hf_generate_rows(model, vocab, args.batch_sizes, args.context)
        return
    print(f"target: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params, context {args.context}, "
          f"step {args.step}, threads {torch.get_num_threads()}")
    shares = args.shares
    rows = []
    for batch in args.batch_sizes:
        generator = torch.Generator().manual_seed(batch)
        target = HFCausalLMTarget(model)
        target.row_slots = True
        target.start(batch)
        context = torch.randint(1, vocab, (batch, args.context), generator=generator)
        target.prefill(context, torch.ones_like(context))
        step = torch.randint(1, vocab, (batch, args.step), generator=generator)
        timed(target, batch, step, 1), timed(target, batch, step, args.step)  # warm-up
        decode, read = [], []
        for _ in range(args.repeats):  # alternate, so drift hits both alike
            decode.append(timed(target, batch, step, 1))
            read.append(timed(target, batch, step, args.step))
        target.close()
        rows.append((batch, min(decode) / args.step, min(read)))  # seconds per decode forward, per read forward
    fixed = rows[0][1]  # a one-row, one-token forward: the fixed cost of a forward (layers' framework overhead)
    print(f"fixed cost of a forward (batch {rows[0][0]}, one token): {1e3 * fixed:.2f} ms")
    a_list = " / ".join(map(str, shares))
    print(f"| batch | decode forward ms (1 token per row) | read forward ms ({args.step} per row) | read / decode "
          f"per token | bound, target forwards free, a = {a_list} | a for 1.5x | bound, one target forward per "
          f"token of a row, a = {a_list} |")
    print("|---:|---:|---:|---:|---|---:|---|")
    for batch, decode_s, read_s in rows:
        ratio = read_s / (args.step * decode_s)  # what a read token costs against a decoded one
        free = " / ".join(f"{1 / (a * ratio + 1 - a):.2f}x" for a in shares)
        needed = (1 - 1 / 1.5) / (1 - ratio)  # 1 / (a * ratio + 1 - a) = 1.5
        # the same, but every forward pays the fixed cost and the target runs as many forwards as target-only
        # (asynchronous rows: some row reads or regenerates in every iteration, and a row writes a token per one)
        per_token = "-"  # the fixed cost's own row: nothing but fixed cost to split
        if decode_s > fixed:
            variable = (read_s - fixed) / (args.step * (decode_s - fixed))
            per_token = " / ".join(f"{decode_s / (fixed + (decode_s - fixed) * (a * variable + 1 - a)):.2f}x"
                                   for a in shares)
        print(f"| {batch} | {1e3 * decode_s:.2f} | {1e3 * read_s:.2f} | {ratio:.3f} | {free} | {needed:.2f} "
              f"| {per_token} |")

if __name__ == "__main__":
    main()
