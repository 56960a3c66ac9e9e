"""Store the large weight files of the zoo copies in .gpucarry/zoo as bfloat16 and rewrite their zoo.json (sizes and
hashes), so the builds fit the device tool's 64 MiB transfer. The benches load them with --dtype bfloat16, which
rounds float32 weights to the same values. Run by prepare.sh: `python carry_zoo_bf16.py [text|media] [ZOO_FOLDER]`
(default .gpucarry/zoo)."""

import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from specmm.zoo import store

# set -> (weight folders stored bf16, entries whose manifest is rewritten); imagegen's .pt files stay float32
SETS = {
    "text": (["code-cpu/target", "ssm-code-cpu/mamba2", "ssm-code-cpu/hybrid", "chainarith-cpu/target",
              "code-drafts-cpu/eagle", "code-drafts-cpu/distilled"],
             ["code-cpu", "ssm-code-cpu", "chainarith-cpu", "code-drafts-cpu"]),
    "media": (["captioner-cpu/target"] + [f"captioner-drafters-cpu/{m}" for m in ("eagle", "msd", "vispec", "dream",
                                                                                   "flash")],
              ["captioner-cpu", "captioner-drafters-cpu"]),
}
SETS["core-vlm"] = (["code-cpu/target", "code-drafts-cpu/eagle", "code-drafts-cpu/distilled"] + SETS["media"][0],
                    ["code-cpu", "code-drafts-cpu"] + SETS["media"][1])  # bench core and vlm in one call (stop 46)

root = Path(sys.argv[2] if len(sys.argv) > 2 else ".gpucarry/zoo")
folders, entries = SETS[sys.argv[1] if len(sys.argv) > 1 else "text"]
for rel in folders:
    path = root / rel / "model.safetensors"
    weights = load_file(path)
    save_file({k: (v.to(torch.bfloat16) if v.is_floating_point() else v).contiguous() for k, v in weights.items()},
              path, metadata={"format": "pt"})
for entry in entries:
    record = store.read_manifest(root / entry)
    record.pop("files")
    record["transport_note"] = "weights stored bf16 for the GPU run"
    store.write_manifest(root / entry, record)
