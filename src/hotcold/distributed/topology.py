"""Ranks grouped into nodes, so one machine can stand in for N nodes x G GPUs.

Rank ``r`` sits on node ``r // ranks_per_node``; a byte between two ranks of
one node crosses the intra-node link (NVLink), between nodes the inter-node
network (InfiniBand/Ethernet).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hotcold.config import ConfigError, is_positive_int


@dataclass(frozen=True)
class Topology:
    world: int
    ranks_per_node: int = 1

    def __post_init__(self) -> None:
        if not is_positive_int(self.world):
            raise ConfigError(f"world must be a positive integer, got {self.world!r}")
        if not is_positive_int(self.ranks_per_node) or self.world % self.ranks_per_node:
            raise ConfigError(f"ranks_per_node must be a positive divisor of world={self.world}, "
                              f"got {self.ranks_per_node!r}")

    @property
    def nodes(self) -> int:
        return self.world // self.ranks_per_node

    def node(self, rank: int) -> int:
        return rank // self.ranks_per_node

    def local(self, rank: int) -> int:
        """The rank's index inside its node."""
        return rank % self.ranks_per_node

    def node_ranks(self, node: int) -> list[int]:
        g = self.ranks_per_node
        return list(range(node * g, (node + 1) * g))

    def cross_node_group(self, local: int) -> list[int]:
        """The ranks with index ``local`` inside their node, one per node."""
        return [n * self.ranks_per_node + local for n in range(self.nodes)]

    def inter_mask(self) -> np.ndarray:
        """bool [P, P]: True where source and destination sit on different nodes."""
        nodes = np.arange(self.world) // self.ranks_per_node
        return nodes[:, None] != nodes[None, :]

    def label(self) -> str:
        return f"{self.nodes}x{self.ranks_per_node}"
