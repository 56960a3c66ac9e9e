"""`specmm distill-draft`: align a small causal LM with a target on text files, so more of its drafts are accepted."""

from __future__ import annotations

import torch

from specmm.cli.common import (
    local_path,
    add_job_options,
    default_device,
    device_arg,
    dtype_arg,
    float_range,
    input_file,
    loading,
    model_folder,
    nonnegative_int,
    positive_int,
    read_text,
)

OWNED = ("config.json", "generation_config.json", "model.safetensors", "trainer_state.pt", "tokenizer*",
         "special_tokens_map.json", "chat_template*", "distill.json")  # what --force deletes


def read_token_stream(paths, tokenizer) -> torch.Tensor:
    """The files' texts tokenized and joined by the tokenizer's EOS (when it has one) into one flat stream."""
    parts = []
    for path in paths:
        ids = tokenizer(read_text("--text", path), add_special_tokens=False)["input_ids"]
        parts.append(torch.tensor(ids + ([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []),
                                  dtype=torch.long))
    return torch.cat(parts)


def check_vocabularies(target: str, draft: str) -> None:
    """Refuse, from the two configs alone (before any weights load), a draft whose vocabulary is not the target's:
    its embedding could not even read the target's token ids."""
    from transformers import AutoConfig

    sizes = {}
    for argument, folder in (("--target", target), ("--draft", draft)):
        with loading(argument, folder, "config"):
            config = AutoConfig.from_pretrained(folder)
        sizes[argument] = getattr(config.get_text_config(), "vocab_size", None)
    if None not in sizes.values() and sizes["--target"] != sizes["--draft"]:
        raise ValueError(f"--draft: {draft} has a vocabulary of {sizes['--draft']} tokens, the target's has "
                         f"{sizes['--target']}; distillation needs a draft with the target's vocabulary (e.g. a "
                         "smaller model of the same family)")


def cmd_distill_draft(args) -> int:
    """Distil --target into --draft on windows of --text; the folder --out is a job (rerun to resume)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specmm.core.draft_distill import DistillConfig, distill_draft, heldout_comparison, text_windows
    from specmm.jobs import Job, atomic_write_json, fingerprint

    args.target = local_path(model_folder("--target", args.target))
    args.draft = local_path(model_folder("--draft", args.draft))
    for path in args.text:
        input_file("--text", path)
    check_vocabularies(args.target, args.draft)
    config = DistillConfig(steps=args.steps, lr=args.lr, temperature=args.temperature,
                           checkpoint_every=args.checkpoint_every, warmup_steps=min(20, args.steps))
    settings = {"target": fingerprint(args.target), "draft": fingerprint(args.draft),
                "text": [fingerprint(p) for p in args.text], "steps": args.steps, "batch_size": args.batch_size,
                "seq_len": args.seq_len, "lr": args.lr, "temperature": args.temperature, "seed": args.seed,
                "heldout_share": args.heldout_share, "dtype": str(args.dtype).removeprefix("torch.")}
    with loading("--target", args.target, "tokenizer"):
        tokenizer = AutoTokenizer.from_pretrained(args.target)
    tokens = read_token_stream(args.text, tokenizer)  # the data is checked before any model loads
    if tokens.numel() * (1 - args.heldout_share) <= args.seq_len + 1:
        raise ValueError(f"--text: the files hold {tokens.numel()} tokens, too few for windows of --seq-len "
                         f"{args.seq_len} (training needs more than {args.seq_len + 1} after the held-out share); "
                         "give more text or a lower --seq-len")
    split = int(tokens.numel() * (1 - args.heldout_share))
    train, heldout = tokens[:split], tokens[split:]
    windows = text_windows(train, args.batch_size, args.seq_len, args.seed)  # refuses a stream too short
    heldout_batch = (text_windows(heldout, 8, min(args.seq_len, heldout.numel() - 2), args.seed)(0)
                     if heldout.numel() > 16 else None)
    with Job(args.out, "distill-draft", settings, resume=True, force=args.force, folder=True, owned=OWNED):
        load = dict(dtype=args.dtype, attn_implementation="sdpa")
        with loading("--target", args.target):
            target = AutoModelForCausalLM.from_pretrained(args.target, **load).to(args.device).eval()
        with loading("--draft", args.draft):
            draft = AutoModelForCausalLM.from_pretrained(args.draft, **load).to(args.device)

        def heldout_figures() -> dict[str, float] | None:
            if heldout_batch is None:
                return None
            return heldout_comparison(draft, target, heldout_batch.to(args.device), config.temperature)

        before = heldout_figures()
        distill_draft(draft, target, windows, config, checkpoint_dir=args.out)
        after = heldout_figures()
        draft.save_pretrained(args.out)
        tokenizer.save_pretrained(args.out)
        atomic_write_json(f"{args.out}/distill.json", {"settings": settings, "train_tokens": train.numel(),
                                                       "heldout_tokens": heldout.numel(), "heldout_before": before,
                                                       "heldout_after": after})
    if before is not None:
        print(f"held-out top-1 agreement with the target {before['top1_agreement']:.3f} -> "
              f"{after['top1_agreement']:.3f}, KL {before['kl']:.4f} -> {after['kl']:.4f}")
    print(f"saved the distilled draft ({args.steps} steps) to {args.out}")
    return 0


def add_parser(sub) -> None:
    """Register `distill-draft`."""
    p = sub.add_parser("distill-draft", help="align a small causal LM with a target by distillation (forward KL on "
                       "text), so more of its drafts are accepted")
    p.add_argument("--target", required=True, help="local HF causal LM folder with its tokenizer")
    p.add_argument("--draft", required=True, help="local HF folder of a smaller causal LM with the target's vocabulary")
    p.add_argument("--text", required=True, nargs="+", help="UTF-8 text files to distil on (e.g. the target's own "
                   "generations, or text like the prompts it will serve)")
    p.add_argument("--out", required=True, help="output folder: the distilled draft, its checkpoints and distill.json")
    p.add_argument("--steps", type=positive_int, default=500)
    p.add_argument("--batch-size", type=positive_int, default=8)
    p.add_argument("--seq-len", type=positive_int, default=256)
    p.add_argument("--lr", type=float_range(0.0, low_open=True), default=1e-3)
    p.add_argument("--temperature", type=float_range(0.0, low_open=True), default=1.0)
    p.add_argument("--heldout-share", type=float_range(0.0, 0.5), default=0.05,
                   help="share of the tokens (at the end) kept out of training to report agreement on")
    p.add_argument("--checkpoint-every", type=positive_int, default=100)
    p.add_argument("--seed", type=nonnegative_int, default=0, help="seeds the training windows")
    add_job_options(p)
    p.add_argument("--device", type=device_arg, default=default_device())
    p.add_argument("--dtype", type=dtype_arg, default=torch.float32)
    p.set_defaults(func=cmd_distill_draft)


__all__ = ["add_parser", "cmd_distill_draft"]
