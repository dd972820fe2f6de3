"""The dataset directory refuses what training cannot use, and swaps in a new dataset without a gap."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hotcold.data import dirswap
from hotcold.data.columns import DatasetError
from hotcold.data.format import Dataset, DatasetWriter, write_dataset
from hotcold.data.loader import eval_batches


def tiny(out: Path, splits: dict, rows: int = 10, label: float = 0.0) -> dict:
    return write_dataset(out, dense=np.zeros((rows, 1), np.float32), sparse=np.zeros((rows, 2), np.int32),
                         labels=np.full(rows, label, np.float32), cardinalities=[3, 4], splits=splits,
                         meta={"name": out.name})


def test_empty_split_is_refused_when_written_and_opened(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="split 'val' is empty"):
        tiny(tmp_path / "ds", {"train": (0, 10), "val": (10, 10), "test": (10, 10)})
    assert not (tmp_path / "ds").exists()
    tiny(tmp_path / "ds", {"train": (0, 8), "val": (8, 9), "test": (9, 10)})
    manifest = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    manifest["splits"]["test"] = [10, 10]     # a dataset written before empty splits were refused
    (tmp_path / "ds" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DatasetError, match=r"dataset ds \(.*\): manifest.json: split 'test' is empty"):
        Dataset.open(tmp_path / "ds")


def test_eval_batches_on_an_empty_split_fail_clearly(tmp_path: Path) -> None:
    tiny(tmp_path / "ds", {"train": (0, 8), "test": (8, 10)})
    ds = Dataset.open(tmp_path / "ds")
    object.__setattr__(ds, "manifest", {**ds.manifest, "splits": {"train": [0, 10], "test": [10, 10]}})
    with pytest.raises(ValueError, match="split 'test' is empty"):
        next(eval_batches(ds, "test", 4))


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_leftovers_of_killed_writers_are_removed_at_the_next_start(tmp_path: Path) -> None:
    script = (f"import os, signal, numpy as np\nfrom hotcold.data.format import DatasetWriter\n"
              f"w = DatasetWriter({str(tmp_path / 'ds')!r}).__enter__()\n"
              f"w.column('sparse', np.int32, (1000, 26))[:] = 1\nos.kill(os.getpid(), signal.SIGKILL)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    assert subprocess.run([sys.executable, "-c", script], env=env).returncode == -signal.SIGKILL
    assert [p.name[:8] for p in tmp_path.iterdir()] == [".ds.tmp-"]
    host = socket.gethostname()
    alive = f".ds.tmp-{host}-{os.getppid()}"               # a running writer on this machine
    elsewhere = f".ds.tmp-elsewhere-{dead_pid()}"          # another machine's (shared disk): its pid means nothing here
    other = f".dsx.tmp-{dead_pid()}"                        # another dataset's
    for name in (f".ds.tmp-{dead_pid()}", f".ds.tmp-{host}-{dead_pid()}", alive, elsewhere, other):
        (tmp_path / name).mkdir()
        (tmp_path / name / "sparse.npy").write_bytes(b"x" * 1000)
    tiny(tmp_path / "ds", {"train": (0, 8), "test": (8, 10)})
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["ds", alive, elsewhere, other])


def test_swap_never_leaves_the_name_without_a_dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "ds"
    tiny(out, {"train": (0, 8), "test": (8, 10)}, label=0.0)
    real_rmtree = dirswap.shutil.rmtree

    def rmtree_then_check(path, *args, **kw):
        real_rmtree(path, *args, **kw)
        assert (out / "manifest.json").is_file(), f"{out} has no dataset after deleting {path}"
    monkeypatch.setattr(dirswap.shutil, "rmtree", rmtree_then_check)
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    if not dirswap._exchange(tmp_path / "a", tmp_path / "b"):
        pytest.skip("no renameat2(RENAME_EXCHANGE) here: the fallback has a short window by design")
    (tmp_path / "a").rmdir(), (tmp_path / "b").rmdir()
    tiny(out, {"train": (0, 8), "test": (8, 10)}, label=1.0)
    assert Dataset.open(out, verify=True).labels[0] == 1.0
    assert [p.name for p in tmp_path.iterdir()] == ["ds"]


def test_swap_without_exchange_and_recovery_of_a_set_aside_dataset(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "ds"
    tiny(out, {"train": (0, 8), "test": (8, 10)}, label=0.0)
    monkeypatch.setattr(dirswap, "_exchange", lambda a, b: False)
    tiny(out, {"train": (0, 8), "test": (8, 10)}, label=1.0)
    assert Dataset.open(out, verify=True).labels[0] == 1.0 and [p.name for p in tmp_path.iterdir()] == ["ds"]
    aside = tmp_path / f".ds.old-{socket.gethostname()}-{dead_pid()}"   # killed between the two renames
    os.rename(out, aside)
    with DatasetWriter(out):
        pass                                                           # a new run starts, then fails
    assert Dataset.open(out, verify=True).labels[0] == 1.0 and [p.name for p in tmp_path.iterdir()] == ["ds"]


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to name the fsynced files")
def test_dataset_files_and_directory_are_fsynced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced = []
    real_fsync = os.fsync

    def record(fd):
        synced.append(Path(os.readlink(f"/proc/self/fd/{fd}")).name)
        real_fsync(fd)
    monkeypatch.setattr(os, "fsync", record)
    tiny(tmp_path / "ds", {"train": (0, 8), "test": (8, 10)})
    assert {"dense.npy", "sparse.npy", "labels.npy", "manifest.json", tmp_path.name} <= set(synced)
    assert synced[-1] == tmp_path.name                                  # the rename itself is made durable
