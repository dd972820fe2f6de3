"""``hotcold claims``: the claims table and figure, each paper's claim beside the measured runs and the cost model.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

import pandas as pd

from hotcold import methods
from hotcold.analysis.claims.figure import claims_figure
from hotcold.analysis.claims.gpu import gpu_columns
from hotcold.analysis.claims.paper_scale import PaperScale
from hotcold.analysis.claims.table import load_profiles, write_claims
from hotcold.analysis.modelled import ShapeOf, model_shapes
from hotcold.analysis.plotting import read_table, save_atomic
from hotcold.analysis.run_records import load_records
from hotcold.config import ConfigError
from hotcold.costmodel.prediction import predict_record
from hotcold.costmodel.profile import load_profile


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
