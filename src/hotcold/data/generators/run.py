"""``generate``: write the dataset a ``GeneratorConfig`` describes, with the generator of its kind."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from hotcold.data.generators.config import GeneratorConfig
from hotcold.data.generators.criteo import CHUNK_ROWS, generate_criteo
from hotcold.data.generators.taobao import generate_taobao
from hotcold.data.generators.taobao_fullsize import CHUNK_CLICKS, generate_taobao_fullsize


def generate(cfg: GeneratorConfig, out: Path | str, progress: bool = True,
             chunk_rows: int | None = None) -> dict[str, Any]:
    """Generate the dataset described by ``cfg`` into directory ``out``; return its manifest.

    ``chunk_rows`` bounds the samples (Taobao at real sizes: clicks) drawn per
    step (memory of the temporaries); it never changes the output and is
    ignored by the capped ``taobao-style``, which builds its samples in one pass.
    """
    if chunk_rows is not None and chunk_rows <= 0:
        raise ValueError(f"chunk_rows must be positive, got {chunk_rows}")
    if cfg.kind == "taobao-style" and cfg.full_size:
        return generate_taobao_fullsize(cfg, Path(out), progress=progress, chunk_clicks=chunk_rows or CHUNK_CLICKS)
    if cfg.kind == "taobao-style":
        return generate_taobao(cfg, Path(out), progress=progress)
    return generate_criteo(cfg, Path(out), progress=progress, chunk_rows=chunk_rows or CHUNK_ROWS)
