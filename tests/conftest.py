"""Shared fixtures: small datasets written in the real on-disk format."""
from __future__ import annotations

import functools
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
import torch

from hotcold.data.format import Dataset, write_dataset

#: trainer devices the store and timer tests run on; the CUDA cases run where a GPU is lent
DEVICES = [
    pytest.param(torch.device("cpu"), id="cpu"),
    pytest.param(torch.device("cuda"), id="cuda", marks=pytest.mark.skipif(
        not torch.cuda.is_available(), reason="no GPU here: the CUDA path runs on a machine with one")),
]


@pytest.fixture(params=DEVICES)
def device(request) -> torch.device:
    return request.param


#: the longest test files of the default tier, longest first (the tiny workflow, the launched ranks, the figures),
#: started first: with `make test`'s workers (pytest-xdist, --dist loadfile --no-loadscope-reorder) a long file
#: handed out last would keep one worker busy while the other waits
LONG_FILES_FIRST = ("test_workflow.py", "test_distributed.py", "test_analysis.py", "test_torchrec_peer.py",
                    "test_cli.py", "test_rw_protocol.py", "test_run_faults.py", "test_flow_resume.py")


def pytest_collection_modifyitems(config, items) -> None:
    first = {name: i for i, name in enumerate(LONG_FILES_FIRST)}
    items.sort(key=lambda item: first.get(item.path.name, len(first)))  # stable: the rest keep their order


# Tiny models train fastest on one thread, and the tests then do not fight
# over the cores with each other or with background work.
torch.set_num_threads(1)


def make_dataset(path: Path, rows: int = 4096, sizes=(50, 7, 300, 1000), seed: int = 0) -> Dataset:
    """Skewed ids, a learnable label; deliberately independent of the generator."""
    rng = np.random.default_rng(seed)
    sizes = list(sizes)
    dense = rng.lognormal(0.0, 1.0, size=(rows, 13)).astype(np.float32)
    sparse = np.stack([np.minimum(rng.zipf(1.3, rows) - 1, n - 1) for n in sizes], axis=1)
    logit = dense[:, 0] - dense[:, 1] + (sparse[:, 0] % 3 == 0) - 0.5
    labels = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    n_train = rows * 3 // 4
    write_dataset(path, dense=np.log1p(dense), sparse=sparse, labels=labels, cardinalities=sizes,
                  splits={"train": (0, n_train), "test": (n_train, rows)}, meta={"name": path.name})
    return Dataset.open(path)


@pytest.fixture(scope="session")
def small_dataset(tmp_path_factory) -> Dataset:
    return make_dataset(tmp_path_factory.mktemp("data") / "small")


def make_multihot_dataset(path: Path, rows: int = 3000, sizes=(50, 7, 300, 1000), bags=(3, 1, 4, 2),
                          seed: int = 0) -> Dataset:
    """Multi-hot, MLPerf's way: each table's bag is a skewed first id and the rest uniform over the table; a
    third of table 0's bags repeat their first id (a repeated id within a bag, summed twice)."""
    rng = np.random.default_rng(seed)
    dense = rng.lognormal(0.0, 1.0, size=(rows, 13)).astype(np.float32)
    cols = []
    for n, k in zip(sizes, bags):
        first = np.minimum(rng.zipf(1.3, rows) - 1, n - 1)
        cols += [first] + [rng.integers(0, n, rows) for _ in range(k - 1)]
    sparse = np.stack(cols, axis=1)
    sparse[: rows // 3, 1] = sparse[: rows // 3, 0]
    logit = dense[:, 0] - dense[:, 1] + (sparse[:, 0] % 3 == 0) - 0.5
    labels = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    n_train = rows * 3 // 4
    write_dataset(path, dense=np.log1p(dense), sparse=sparse, labels=labels, cardinalities=list(sizes),
                  splits={"train": (0, n_train), "test": (n_train, rows)}, meta={"name": path.name}, bags=list(bags))
    return Dataset.open(path)


@pytest.fixture(scope="session")
def multihot_dataset(tmp_path_factory) -> Dataset:
    return make_multihot_dataset(tmp_path_factory.mktemp("data") / "multihot")


def make_sequence_dataset(path: Path, rows: int = 3000, sizes=(40, 500, 30), max_length: int = 6,
                          seed: int = 0) -> Dataset:
    """Taobao-shaped: (user, item, category) targets and (item, category) histories of varying length.

    Positives share their category with some history event; negatives mostly don't.
    """
    rng = np.random.default_rng(seed)
    users, items, cats = sizes
    item_cat = rng.integers(0, cats, items)
    lengths = rng.integers(0, max_length + 1, rows)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    hist_items = np.minimum(rng.zipf(1.2, offsets[-1]) - 1, items - 1)
    history = np.stack([hist_items, item_cat[hist_items]], axis=1)
    labels = (rng.random(rows) < 0.5).astype(np.float32)
    target = np.minimum(rng.zipf(1.2, rows) - 1, items - 1)
    for n in np.nonzero((labels == 1) & (lengths > 0))[0]:
        same = np.nonzero(item_cat == history[offsets[n + 1] - 1, 1])[0]
        target[n] = rng.choice(same)
    sparse = np.stack([rng.integers(0, users, rows), target, item_cat[target]], axis=1)
    n_train = rows * 3 // 4
    write_dataset(path, dense=np.zeros((rows, 0), np.float32), sparse=sparse, labels=labels,
                  cardinalities=list(sizes), splits={"train": (0, n_train), "test": (n_train, rows)},
                  meta={"name": path.name}, history=history, history_offsets=offsets,
                  sequence={"tables": [1, 2], "max_length": max_length})
    return Dataset.open(path)


@pytest.fixture(scope="session")
def sequence_dataset(tmp_path_factory) -> Dataset:
    return make_sequence_dataset(tmp_path_factory.mktemp("data") / "seq")


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def file_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """``(base URL, served directory)`` of a plain local HTTP server on 127.0.0.1."""
    root = tmp_path / "www"
    root.mkdir()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(root)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", root
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


@pytest.fixture
def drawn_figures(tmp_path: Path, monkeypatch):
    """``draw(tables)``: the figures ``make_figures`` draws from ``tables``, by name, as they are before saving."""
    from hotcold.analysis import figures

    def draw(tables: Path) -> dict:
        drawn = {}

        def keep(fig, out_dir, stem):  # drawn, not written: saving is what ``test_figures_are_written`` checks
            drawn[stem] = fig
            return []

        monkeypatch.setattr(figures, "save_atomic", keep)
        figures.make_figures(tables, tmp_path / "figs")
        for fig in drawn.values():
            fig.draw_without_rendering()
        return drawn

    return draw
