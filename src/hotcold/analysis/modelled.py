"""The cost model beside measured runs: a record's dense model sizes, and the model's validation.

Pricing a run record on a hardware profile needs the dense model's sizes,
which come from the run's dataset and model config: ``model_shapes`` finds
them under a datasets directory, once per dataset. ``hotcold
costmodel-validation`` is ``validation_report``; ``hotcold claims`` is
``claims.report.claims_report``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

import pandas as pd

from hotcold.costmodel.profile import HardwareProfile, load_profile
from hotcold.costmodel.workload import ModelShape

ShapeOf = Callable[[dict[str, Any]], "ModelShape | None"]


def model_shapes(data_dir: str | Path) -> ShapeOf:
    """A function giving a record's dense model sizes from its dataset under ``data_dir`` (None when absent)."""
    from hotcold.run_config import RunConfig
    from hotcold.data.format import Dataset

    shapes: dict[str, ModelShape | None] = {}

    def shape_of(rec: dict[str, Any]) -> ModelShape | None:
        name = rec["dataset"]
        if name not in shapes:
            path = Path(data_dir) / name
            shapes[name] = ModelShape.of(Dataset.open(path), RunConfig.from_dict(rec["config"]).model) \
                if (path / "manifest.json").is_file() else None
        return shapes[name]

    return shape_of


def validation_report(records: Sequence[Path], profile_path: str | Path, data_dir: str | Path,
                      out_dir: Path) -> tuple[pd.DataFrame, HardwareProfile]:
    """Write ``costmodel_validation.csv``/``.md`` for the records on one profile; the summary and the profile."""
    from hotcold.analysis.costmodel_validation import write_validation
    from hotcold.analysis.run_records import load_records

    profile = load_profile(profile_path)
    loaded = load_records(list(records))
    return write_validation(loaded, profile, Path(out_dir), model_shapes(data_dir)), profile
