"""Pick the device the series runs on: the GPU when there is one, else the CPU; and name the machine."""

import os
import platform
from pathlib import Path

import torch


def get_device() -> torch.device:
    """Return ``cuda`` when a CUDA GPU is visible, otherwise ``cpu``.

    Every notebook calls this once and moves its models and tensors there;
    plots always take ``.cpu()`` copies.
    """
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def describe_machine() -> str:
    """The CPU's name (from /proc/cpuinfo where there is one), cores, threads torch uses, OS, Python, torch."""
    info = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []
    name = next((ln.split(":", 1)[1].strip() for ln in info if ln.startswith("model name")), platform.machine())
    return (
        f"{name}, {os.cpu_count()} logical cores visible, torch.set_num_threads({torch.get_num_threads()}); "
        f"{platform.system()} {platform.release()}, Python {platform.python_version()}, torch {torch.__version__}"
    )
