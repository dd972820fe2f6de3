"""What a calibration measured: each rate with a source naming its benchmark, the processor and the date.

``Calibration`` holds the benchmarks' shapes (embedding dimension, batch,
lookups, table size), their repeats and the rates they put. The benchmarks
that fill it: ``calibrate.host`` (host memory, id planning, the cache
directory, the loader), ``calibrate.network`` (loopback gloo collectives)
and ``calibrate.device`` (the dense step, the GPU's copies and kernels);
``hotcold.calibrate.profile`` runs them and writes the profile.
"""
from __future__ import annotations

import datetime as dt
from typing import Any

import torch

from hotcold.costmodel.profile import ALL_RATES
from hotcold.machine import cpu_name

MiB = 1 << 20


class Calibration:
    """The measured rates, each with a source naming its benchmark, the processor and the date.

    Each benchmark times the operation the stores really run (``index_select``
    gathers, ``index_copy_`` scatters, ``to_global`` and ``RowGroups.of`` id
    planning, the cache directory's planning, the DLRM dense step), repeats it
    and keeps the median (``timing.median_ms``). Tables are larger than the
    last-level cache and ids are drawn per table with the Criteo-style
    generator's power law (``data.powerlaw``), so gathers see the runs' repeats
    and cached hot rows (uniform ids over a table beyond the cache cost some 20x
    more a row here). The machine's facts (CPU, cores, cache) come from
    ``hotcold.machine``.
    """

    def __init__(self, dim: int, batch_size: int, lookups: int, repeats: int, table_mib: int) -> None:
        self.dim, self.batch, self.lookups, self.repeats = dim, batch_size, lookups, repeats
        self.rows = table_mib * MiB // (4 * dim)
        self.rates: dict[str, dict[str, Any]] = {}
        self.notes: list[str] = []   # rates not measured, and why
        self.when = dt.date.today().isoformat()
        self.cpu = f"{cpu_name()} ({torch.get_num_threads()} threads)"
        self.gen = torch.Generator().manual_seed(0)

    def put(self, key: str, value: float, how: str, on: str | None = None) -> None:
        self.rates[key] = {"value": float(max(value, 1e-6)), "unit": ALL_RATES[key][0],
                           "source": f"measured by hotcold calibrate on {on or self.cpu}, {self.when}: {how}"}
