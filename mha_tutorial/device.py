"""Pick the device the series runs on: the GPU when there is one, else the CPU."""

import torch


def get_device() -> torch.device:
    """Return ``cuda`` when a CUDA GPU is visible, otherwise ``cpu``.

    Every notebook calls this once and moves its models and tensors there;
    plots always take ``.cpu()`` copies.
    """
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
