"""What a GPU check runs on: the packages it needs that this interpreter lacks, and the GPU, torch and CUDA.

A GPU machine lent for a check has torch but maybe not every package
``make setup`` installs. ``missing`` names the modules the check's path
imports and cannot do without (one line, before anything heavy is
imported); ``optional`` says which optional ones are absent and what that
changes (numba: the kernels run as plain Python, same numbers, slower;
fbgemm_gpu: the ``fbgemm`` runs are ``skipped``).
"""
from __future__ import annotations

import importlib.util
import os
import platform
import sys
from typing import Any

#: module -> distribution (pip name) of every package the check's own path imports: training, records, tables
REQUIRED = {"torch": "torch", "numpy": "numpy", "pandas": "pandas", "pyarrow": "pyarrow", "tqdm": "tqdm",
            "yaml": "PyYAML"}
#: module -> what its absence changes
OPTIONAL = {"numba": "the kernels run as plain Python (the same numbers, slower)",
            "fbgemm_gpu": "the fbgemm runs are skipped"}


def _present(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def missing() -> list[str]:
    """The required packages this interpreter cannot import, as pip names them."""
    return [dist for module, dist in REQUIRED.items() if not _present(module)]


def missing_message() -> str | None:
    """One line naming the missing required packages (None: all present)."""
    gone = missing()
    if not gone:
        return None
    return (f"gpu-check needs {', '.join(gone)}, not importable by {sys.executable} "
            f"(install with: {sys.executable} -m pip install {' '.join(gone)})")


def optional() -> dict[str, str]:
    """The optional packages absent here -> what that changes."""
    return {module: effect for module, effect in OPTIONAL.items() if not _present(module)}


def environment(device: str) -> dict[str, Any]:
    """The GPU (or CPU), torch, CUDA and Python of this check, with the code's provenance."""
    import numpy as np
    import pandas as pd
    import torch

    from hotcold.runs.records import provenance, timer_kind

    dev = torch.device(device)
    out: dict[str, Any] = {**provenance(dev, timer_kind(dev)), "numpy": np.__version__, "pandas": pd.__version__,
                           "platform": platform.platform(), "cpu_count": os.cpu_count(),
                           "cuda_available": torch.cuda.is_available(),
                           "torch_cuda": torch.version.cuda, "absent_optional": optional()}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(dev if dev.type == "cuda" else 0)
        out.update(gpu=props.name, gpu_count=torch.cuda.device_count(),
                   gpu_memory_gib=round(props.total_memory / 2**30, 1),
                   gpu_capability=f"{props.major}.{props.minor}",
                   cudnn=torch.backends.cudnn.version())
    return out


def header(env: dict[str, Any]) -> str:
    """One line: device, torch, CUDA, Python."""
    gpu = env.get("gpu")
    where = (f"GPU {gpu} ({env.get('gpu_memory_gib')} GiB, capability {env.get('gpu_capability')}, driver "
             f"{env.get('driver') or 'unknown'})" if gpu else "no GPU")
    trained = "trained on the GPU" if env.get("device_type") == "cuda" else "trained on the CPU"
    return (f"{where}; {trained}; torch {env['torch']}, CUDA {env.get('torch_cuda') or 'none'}, "
            f"Python {env['python']}, {env.get('cpu_count')} CPU cores; commit {str(env.get('git_commit'))[:10]}"
            + (" (modified tree)" if env.get("git_dirty") else ""))
