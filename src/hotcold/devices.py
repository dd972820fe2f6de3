"""Device names: ``cuda`` made ``cuda:<index>``, so that one GPU has one name.

``torch.device("cuda") != torch.device("cuda:0")``: a store that keys a cache
by device, or compares its device with a tensor's, would otherwise see two
devices where there is one and ship the same tensor twice.
"""
from __future__ import annotations

import torch


def normal_device(device: torch.device | str) -> torch.device:
    """``device`` with an index: ``cuda`` becomes ``cuda:<current index>``; ``cpu`` and indexed devices stay.

    Without a usable GPU a bare ``cuda`` is returned as it is (no tensor can
    live there to be compared with it).
    """
    device = torch.device(device)
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return device
