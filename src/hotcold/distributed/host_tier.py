"""The rows a rank owns in its host memory (``Plan.off_device``: RecShard's UVM rows, FlexShard's unseen rows).

A plan may keep some sharded rows in their owner's host memory (``Plan.off_device``).
The owner holds them apart from its device rows: weights and optimizer state
in host memory, after the device rows in its local order (``device_first``).
A lookup of one gathers it on the host and copies the vector to the device;
its gradient, summed on the device with the others, is copied back and the
same ``RowOptimizer`` updates it on the host: the ``hybrid`` store's path, so
the model trained is the one the ``device`` store trains. Each such lookup is
counted as a host lookup and its vector and gradient as activation traffic
(``host_lookups.host_counts``), in the training store and in ``shard-sim`` alike.
"""
from __future__ import annotations

import numpy as np
import torch

from hotcold.embedding.update import RowOptimizer


def device_first(owned: np.ndarray, host: np.ndarray | None) -> tuple[np.ndarray, int]:
    """``owned`` [M] global rows reordered with the device rows first, and how many those are."""
    if host is None:
        return owned, int(owned.size)
    on_host = host[owned]
    return np.concatenate([owned[~on_host], owned[on_host]]), int((~on_host).sum())


class HostTier:
    """One rank's host rows: local positions ``first ..`` of its held rows, their weights and state on the host."""

    def __init__(self, weight: torch.Tensor, optimizer: RowOptimizer, first: int, device: torch.device) -> None:
        self.first = first
        self.device = device
        pin = device.type == "cuda"
        self.weight = weight.contiguous().pin_memory() if pin else weight.contiguous()
        self.state = optimizer.init_state(weight.shape[0], weight.shape[1], "cpu")

    def lookups(self, positions: torch.Tensor) -> int:
        """How many of the served local ``positions`` are host rows."""
        return int((positions >= self.first).sum())

    def gather(self, device_weight: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Held rows at local ``positions`` [R] -> [R, width] on the device: device rows gathered there,
        host rows gathered on the host and copied over."""
        positions = positions.cpu()
        on_host = positions >= self.first
        if not bool(on_host.any()):
            return device_weight.index_select(0, positions.to(self.device, non_blocking=True))
        out = torch.empty(positions.numel(), device_weight.shape[1], dtype=device_weight.dtype, device=self.device)
        dev = (~on_host).nonzero().squeeze(1)
        host = on_host.nonzero().squeeze(1)
        out[dev.to(self.device)] = device_weight.index_select(0, positions[dev].to(self.device))
        out[host.to(self.device)] = self.weight.index_select(0, positions[host] - self.first).to(self.device)
        return out

    def apply(self, optimizer: RowOptimizer, slots: torch.Tensor,
              summed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Update the host rows among ``slots`` [U] (local positions) with their summed gradients (copied to the
        host); return the device rows' slots and gradients for the caller's update."""
        on_host = slots >= self.first
        if bool(on_host.any()):
            grad = summed[on_host].to("cpu", dtype=torch.float32)
            optimizer.apply(self.weight, self.state, (slots[on_host] - self.first).cpu(), grad)
        keep = ~on_host
        return slots[keep], summed[keep]

    def rows(self, device_weight: torch.Tensor) -> torch.Tensor:
        """Every held row's weights on the device, in local order (the export's)."""
        return torch.cat([device_weight, self.weight.to(device_weight.device)])
