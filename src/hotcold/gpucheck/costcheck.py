"""The cost model checked on a check's own runs: this machine calibrated in the same call, then modelled
step times against measured ones.

A profile calibrated on another machine does not describe this one: two fresh
GPU machines of one kind ran the same code 1.7x apart (docs/costmodel.md,
"Validation on a GPU"). So the check calibrates before it trains (``hotcold
calibrate``, about 10 s on a GPU) and prices its own records on that profile
(``hotcold costmodel-validation``): ``profile.yaml`` and
``costmodel_validation.md`` beside the table.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

PROFILE = "profile.yaml"
WRITTEN = (PROFILE, "costmodel_validation.csv", "costmodel_validation_summary.csv", "costmodel_validation.md")


@dataclass
class CostCheck:
    """What the model check gave: the profile written, the validation's step errors, or why there are none."""

    profile: Path | None = None
    name: str = ""                                 # the profile's name
    error: str | None = None
    step_errors: dict[str, float] | None = None   # method/variant -> (modelled - measured) / measured

    def line(self) -> str:
        if self.error:
            return f"Cost model: not checked ({self.error})."
        if self.profile is None:
            return "Cost model: not checked (no calibration asked for)."
        if not self.step_errors:
            return f"Cost model: profile `{self.name}` calibrated in this call; no stable run to price."
        worst = max(self.step_errors, key=lambda k: abs(self.step_errors[k]))
        lo, hi = min(self.step_errors.values()), max(self.step_errors.values())
        return (f"Cost model on profile `{self.name}`, calibrated in this call: step error {lo:+.0%} to {hi:+.0%} "
                f"over {len(self.step_errors)} stable run group(s), the largest {worst} "
                f"(`costmodel_validation.md`).")

    def as_dict(self) -> dict[str, Any]:
        return {"profile": self.profile.name if self.profile else None, "name": self.name, "error": self.error,
                "step_errors": self.step_errors}


def clear(out: Path) -> None:
    """Remove an earlier check's profile and validation: this call's runs are never priced on them."""
    for name in WRITTEN:
        (Path(out) / name).unlink(missing_ok=True)


def calibrate_here(check: CostCheck, out: Path, device: str, threads: int, repeats: int = 15) -> None:
    """Measure this machine's rates as the runs will use it (their threads); write ``out/profile.yaml``."""
    from hotcold.calibrate.profile import calibrate, write_profile

    profile = calibrate(device, repeats=repeats, network=False, threads=threads, name=f"gpu-check-{device}")
    check.profile, check.name = write_profile(profile, Path(out) / PROFILE), profile["name"]


def validate(records: Sequence[Path], profile: Path, data_dir: Path, out: Path) -> dict[str, float]:
    """Write ``costmodel_validation.csv``/``.md`` under ``out``; the step error of every stable group."""
    from hotcold.analysis.modelled import validation_report

    summary, _ = validation_report(list(records), profile, data_dir, Path(out))
    return {f"{r.method}/{r.variant}" + (f" x{r.world}" if r.world > 1 else ""): float(r.step_error)
            for r in summary.itertuples() if math.isfinite(r.step_error)}
