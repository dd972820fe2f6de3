"""The reports that set the cost model beside measured runs: the claims table and figure, the model's validation.

Both price a run record on a hardware profile, and pricing needs the dense
model's sizes, which come from the run's dataset and model config:
``model_shapes`` finds them under a datasets directory, once per dataset.
``hotcold claims`` and ``hotcold costmodel-validation`` are ``claims_report``
and ``validation_report``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

import pandas as pd

from hotcold import methods
from hotcold.config import ConfigError
from hotcold.costmodel import HardwareProfile, ModelShape, load_profile, predict_record

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


def claims_report(records: Sequence[Path], comm_traffic: Path, profiles: Sequence[str | Path], data_dir: str | Path,
                  out_dir: Path, figures_dir: Path, sims: Sequence[Path] = (), shard_sims: Sequence[Path] = (),
                  sim_configs: str | dict[str, Any] | None = None, gpu_records: Sequence[Path] = (),
                  gpu_profile: str | Path | None = None) -> tuple[pd.DataFrame, list[Path]]:
    """Write ``claims.csv``/``.md``/``claims_sweep.csv`` to ``out_dir`` and the claims figure to ``figures_dir``;
    the table and figures.

    ``comm_traffic``: the table of ``hotcold scaleout-tables``; ``profiles``:
    the hardware profiles the modelled values use; ``sims``, ``shard_sims``
    and ``sim_configs``: the simulations (``<dataset>.csv``) and the configs
    they ran under, for the paper-scale columns (``paper_scale.PaperScale``);
    ``gpu_records`` (record.json files, or folders holding them) and
    ``gpu_profile``: the claims on a GPU (``claims_gpu``); without records, the
    reproduction's own CUDA-timed runs, if any.
    """
    from hotcold.analysis.claims_gpu import gpu_columns
    from hotcold.analysis.paper_scale import PaperScale

    from hotcold.analysis.claims import load_profiles, write_claims
    from hotcold.analysis.claims_figure import claims_figure
    from hotcold.analysis.plotting import read_table, save_atomic
    from hotcold.analysis.run_records import load_records

    loaded = load_records(list(records))
    comm = read_table(Path(comm_traffic), "run `hotcold scaleout-tables` first")
    shape_of = model_shapes(data_dir)
    paper = PaperScale.load(sims, shard_sims, sim_configs, data_dir)

    def predictor(shape: ShapeOf) -> Callable[[dict[str, Any], Any], Any]:
        return lambda rec, profile: predict_record(rec, profile, methods.price(rec["method"]), shape(rec))

    predict = predictor(shape_of)
    missing = [str(p) for p in gpu_records if not Path(p).exists()]
    if missing:
        raise ConfigError(f"claims: --gpu-records {', '.join(missing)}: no such file or folder")
    files = [f for p in gpu_records for f in (sorted(Path(p).rglob("record.json")) if Path(p).is_dir() else [Path(p)])]
    named = ", ".join("/".join(Path(p).resolve().parts[-4:]) for p in gpu_records)  # not this machine's whole path
    gpu, source, gpu_predict = ((load_records(files), named, predictor(lambda rec: None)) if files  # not here
                                else (loaded, "this reproduction", predict))
    gpu_prof = load_profile(gpu_profile) if gpu_profile else None
    frame = write_claims(loaded, comm, load_profiles(profiles), Path(out_dir), predict=predict, paper=paper,
                         shape_of=shape_of, more=lambda row, claim: gpu_columns(row, claim, gpu, source, gpu_prof,
                                                                                gpu_predict))
    return frame, save_atomic(claims_figure(frame), Path(figures_dir), "claims")


def validation_report(records: Sequence[Path], profile_path: str | Path, data_dir: str | Path,
                      out_dir: Path) -> tuple[pd.DataFrame, HardwareProfile]:
    """Write ``costmodel_validation.csv``/``.md`` for the records on one profile; the summary and the profile."""
    from hotcold.analysis.costmodel_validation import write_validation
    from hotcold.analysis.run_records import load_records

    profile = load_profile(profile_path)
    loaded = load_records(list(records))
    return write_validation(loaded, profile, Path(out_dir), model_shapes(data_dir)), profile
