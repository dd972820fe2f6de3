"""The trainer device: chosen once, where the job runs (``resolve_device``), and named one way.

``cuda`` is made ``cuda:<index>``, so that one GPU has one name:

``torch.device("cuda") != torch.device("cuda:0")``: a store that keys a cache
by device, or compares its device with a tensor's, would otherwise see two
devices where there is one and ship the same tensor twice.
"""
from __future__ import annotations

import torch

from hotcold.config import ConfigError


def normal_device(device: torch.device | str) -> torch.device:
    """``device`` with an index: ``cuda`` becomes ``cuda:<current index>``; ``cpu`` and indexed devices stay.

    Without a usable GPU a bare ``cuda`` is returned as it is (no tensor can
    live there to be compared with it).
    """
    device = torch.device(device)
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return device


def resolve_device(name: str) -> torch.device:
    """``auto`` is the GPU when there is one (``cuda:<index>``); asking for ``cuda`` without one fails clearly."""
    if name == "auto":
        return normal_device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("timing.device is 'cuda' but torch sees no GPU (use 'auto' or 'cpu')")
    return normal_device(name)  # cuda: cuda:<current index>, one name per GPU
