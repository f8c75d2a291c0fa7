"""Device selection: ``device=auto`` picks CUDA when present."""

from __future__ import annotations

import torch

from dprec_torch.errors import ConfigError


def resolve_device(name: str = "auto") -> torch.device:
    """Map ``auto|cpu|cuda[:n]`` to a :class:`torch.device`."""
    name = str(name).lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device={name} asked for CUDA but none is available; use device=cpu or device=auto")
    try:
        return torch.device(name)
    except RuntimeError as err:
        raise ConfigError(f"unknown device '{name}'; use auto, cpu or cuda") from err
