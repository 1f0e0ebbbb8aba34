"""Collect the torch-only modules' doctests only where torch is installed (an optional extra)."""

import importlib.util

TORCH_MODULES = [
    "stragglar/ddp",
    "stragglar/fsdp",
    "stragglar/runtime/roll_call.py",
    "stragglar/runtime/torch_dist.py",
    "stragglar/measure/run_torch.py",
]
collect_ignore = [] if importlib.util.find_spec("torch") else TORCH_MODULES
