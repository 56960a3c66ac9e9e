"""Can the zoo's ViSpec drafter accept more tokens than its EAGLE drafter? Recipe variants, trained and measured.

Run: `OMP_NUM_THREADS=2 python benchmarks/vispec_vs_eagle_zoo.py --work W [--scale cpu-long] [--variants ...]`
(after `specmm zoo build captioner-drafters --scale cpu`, or `cpu-long`: the captioner with 144 image tokens). Each
variant is the `captioner-drafters` cpu recipe restricted to one method
(`captioner_drafters.only`, seeded as in the full entry) with the variant's changes, built into W/<variant>
(skipped when already there). Every drafter, the zoo entry's own included, then drafts greedy chains of length
k over the first `--scenes` held-out scenes (batch 8, 160 new tokens, eager: acceptance does not depend on the
mode), and the report gives the mean accepted tokens per target step and the acceptance at each depth given
the depth before. A last check runs chains of one and counts the accepted drafts against what the drafter's
teacher-forced predictions over the same captions give, which would differ if drafting fed the head differently
from training.
"""

import argparse
import json
import os
import sys
from pathlib import Path

import torch

import specmm
from specmm import zoo
from specmm.bench.vlm import heldout_seeds, scene_batch
from specmm.core.stats import GenerationStats
from specmm.core.target import PrefillOutput
from specmm.vlm.drafter import IMAGE_MASK
from specmm.vlm.train import run_target
from specmm.zoo import captioner, captioner_drafters

MAX_NEW = 160
# name -> (method, recipe changes); the zoo entry's own eagle and vispec are the "zoo" rows
VARIANTS = {
    "vispec num_q=5": ("vispec", {"method_options": {"vispec": {"num_q": 5}}}),
    "vispec num_q=9": ("vispec", {"method_options": {"vispec": {"num_q": 9}}}),
    "vispec 2 self-fed passes": ("vispec", {"multimodal": {"vispec_unroll_steps": 2}}),
    "eagle 660 steps": ("eagle", {"multimodal": {"steps": 660}}),
    "vispec 660 steps": ("vispec", {"multimodal": {"steps": 660}}),
    "vispec 660 steps, 2 self-fed passes": ("vispec", {"multimodal": {"steps": 660, "vispec_unroll_steps": 2}}),
}


def folder(name: str) -> str:
    return name.replace(" ", "_").replace(",", "").replace("=", "")


def build_variant(dest: Path, method: str, changes: dict, scale: str = "cpu") -> dict:
    recipe = captioner_drafters.only(method)[scale]
    for key, value in changes.items():
        recipe[key] = {**recipe[key], **value} if isinstance(value, dict) else value
    record_path = dest / "record.json"
    if record_path.is_file():
        return json.loads(record_path.read_text())
    record = captioner_drafters.build(dest, recipe, 0, progress=False)["methods"][method]
    record_path.write_text(json.dumps(record))
    return record


def acceptance(models, drafter, seeds: list[int], k: int) -> tuple[float, list[float]]:
    """(mean accepted, P(depth d accepted | depth d-1 accepted) for d = 1..k) of greedy chains of k."""
    tokenizer = models.processor.tokenizer
    generator = specmm.SpeculativeGenerator(models.target, drafter, tree=specmm.TreeSpec.chain(k))
    total = GenerationStats()
    for i in range(0, len(seeds), 8):
        out = generator.generate(**scene_batch(models, seeds[i: i + 8]), max_new_tokens=MAX_NEW,
                                 eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        total.add(out.stats)
    counts = total.accepted_histogram
    reached = [sum(counts[d:]) for d in range(len(counts))]
    return total.mean_accepted, [reached[d + 1] / reached[d] for d in range(len(counts) - 1)]


def drafting_matches_training(models, drafter, seeds: list[int]) -> tuple[int, int]:
    """(accepted drafts with chains of one, the count the teacher-forced argmax gives over the same tokens)."""
    tokenizer = models.processor.tokenizer
    generator = specmm.SpeculativeGenerator(models.target, drafter, tree=specmm.TreeSpec.chain(1))
    realized = simulated = 0
    for seed in seeds:
        enc = scene_batch(models, [seed])
        out = generator.generate(**enc, max_new_tokens=MAX_NEW, eos_token_id=tokenizer.eos_token_id,
                                 pad_token_id=tokenizer.pad_token_id)
        realized += out.stats.accepted_histogram[1]
        prompt, new = enc["input_ids"].shape[1], out.stats.new_tokens_per_row[0]
        ids = out.sequences[:, : prompt + new]
        batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "pixel_values": enc["pixel_values"]}
        passed = run_target(models.target, batch)
        prefill = PrefillOutput(passed.features[:, :-1], passed.inputs_embeds[:, :-1],
                                {IMAGE_MASK: passed.image_mask[:, :-1]})
        hidden = drafter.teacher_forced(ids, batch["attention_mask"], prefill)[0].last_hidden_state
        predicted = drafter.lm_head(hidden).argmax(-1)[0]  # slot t predicts token t + 2
        position = prompt  # the first round drafts from the last prompt token
        while position < prompt + new:
            accepted = bool(predicted[position - 2] == ids[0, position])
            simulated += accepted
            position += 2 if accepted else 1
    return realized, simulated


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True, help="folder for the variants' builds")
    parser.add_argument("--scenes", type=int, default=32)
    parser.add_argument("--k", type=int, nargs="+", default=[4, 6])
    parser.add_argument("--check-scenes", type=int, default=8)
    parser.add_argument("--scale", default="cpu", help="captioner and captioner-drafters scale (cpu-long: 144 "
                        "image tokens)")
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS),
                        help="recipe variants to build and measure besides the zoo entry's own drafters")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    models = captioner.load(zoo.path("captioner", args.scale))
    zoo_drafters = zoo.path("captioner-drafters", args.scale)
    record = zoo.record("captioner-drafters", args.scale)
    rows = {f"{m} (zoo recipe: {record['recipe']['multimodal']['steps']} steps)":
            (zoo_drafters, m, record["methods"][m]) for m in ("eagle", "vispec")}
    for name in args.variants:
        method, changes = VARIANTS[name]
        print(f"building {name}", file=sys.stderr, flush=True)
        rows[name] = (args.work / folder(name), method,
                      build_variant(args.work / folder(name), method, changes, args.scale))
    seeds = heldout_seeds(args.scale)[: args.scenes]
    lines = ["| drafter | parameters | stage-2 train top-1 | " + " | ".join(
        f"k={k}: mean accepted | k={k}: P(depth d \\| d-1), d=1..{k}" for k in args.k) + " |",
             "|---|---:|---:|" + "---:|---|" * len(args.k)]
    with torch.no_grad():
        for name, (path, method, record) in rows.items():
            drafter = captioner_drafters.load(path, method, models.target)
            cells = []
            for k in args.k:
                mean, conditional = acceptance(models, drafter, seeds, k)
                cells += [f"{mean:.3f}", " ".join(f"{c:.3f}" for c in conditional)]
            lines.append(f"| {name} | {record['parameters']} | {record['multimodal']['final_top1']:.4f} | "
                         + " | ".join(cells) + " |")
            print(lines[-1], flush=True)
        lines += ["", "| drafter | accepted drafts, chains of one | from teacher-forced predictions |",
                  "|---|---:|---:|"]
        for name, (path, method, _) in list(rows.items())[:2]:
            drafter = captioner_drafters.load(path, method, models.target)
            realized, simulated = drafting_matches_training(models, drafter, seeds[: args.check_scenes])
            lines.append(f"| {name} | {realized} | {simulated} |")
            print(lines[-1], flush=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
