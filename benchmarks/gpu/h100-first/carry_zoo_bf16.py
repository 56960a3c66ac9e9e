import json, sys, torch
from pathlib import Path
from safetensors.torch import load_file, save_file
from specmm.zoo import store
root = Path(".gpucarry/zoo")
for rel in ["code-cpu/target", "ssm-code-cpu/mamba2", "ssm-code-cpu/hybrid"]:
    f = root / rel / "model.safetensors"
    sd = load_file(f)
    meta = {"format": "pt"}
    save_file({k: (v.to(torch.bfloat16) if v.is_floating_point() else v).contiguous() for k, v in sd.items()}, f, metadata=meta)
for entry in ["code-cpu", "ssm-code-cpu"]:
    folder = root / entry
    rec = store.read_manifest(folder)
    rec.pop("files"); rec["transport_note"] = "weights stored bf16 for the GPU run"
    store.write_manifest(folder, rec)
