"""What a report or a zoo record says about the machine it ran on."""

from __future__ import annotations

import os
import platform

import torch


def machine_info(device: torch.device | str = "cpu") -> dict:
    device = torch.device(device)
    info = {"python": platform.python_version(), "torch": torch.__version__, "platform": platform.platform(),
            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "device": str(device)}
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:  # pragma: no cover
        pass
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info
