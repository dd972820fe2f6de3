"""Training memory: tables drawn in place, no second copy of the rows, and runs that do not fit end infeasible."""
from __future__ import annotations

import hashlib
import json

import pytest
import torch

import hotcold.embedding.device
import hotcold.embedding.rows
from hotcold import machine, memory
from hotcold.cli import main
from hotcold.config import ConfigError, InfeasibleError
from hotcold.run_config import RunConfig
from hotcold.embedding.base import MemoryNeed, StoreSpec
from hotcold.embedding.cache import FreqCacheStore
from hotcold.embedding.device import DeviceStore
from hotcold.embedding.hybrid import HybridStore
from hotcold.embedding.rows import init_table, table_bytes
from hotcold.embedding.update import RowOptimizer
from hotcold.runs.records import param_checksum
from hotcold.train import train

CPU = torch.device("cpu")
RUN = {"dataset": "small", "seed": 0, "model": {"embedding_dim": 8, "bottom_mlp": [8], "top_mlp": [8, 1]},
       "train": {"steps": 6, "warmup_steps": 1, "batch_size": 64, "eval_batch_size": 512, "eval_samples": 512}}


def drawn_whole(sizes: list[int], dim: int, seed: int) -> torch.Tensor:
    """The tables as they were drawn before the chunked fill: one whole tensor per table, concatenated."""
    gen = torch.Generator().manual_seed(seed)
    parts = [torch.empty(n, dim).uniform_(-(1.0 / n) ** 0.5, (1.0 / n) ** 0.5, generator=gen) for n in sizes]
    return torch.cat(parts)


@pytest.mark.parametrize("chunk_rows", [None, 1, 7, 1000, 1 << 20])
def test_initial_rows_are_the_same_bits_however_they_are_drawn(chunk_rows):
    sizes = [1000, 3, 5001, 64]
    assert torch.equal(init_table(sizes, 16, 7, chunk_rows=chunk_rows), drawn_whole(sizes, 16, 7))
    assert not torch.equal(init_table(sizes, 16, 8, chunk_rows=chunk_rows), drawn_whole(sizes, 16, 7))


def test_sgd_keeps_no_state_per_row_adagrad_one_float_and_per_element_adagrad_a_row_of_them():
    sgd, adagrad, element = (RowOptimizer(kind, 0.1).init_state(10_000, 16)
                             for kind in ("sgd", "adagrad", "elementwise-adagrad"))
    assert sgd.shape == adagrad.shape == (10_000,) and element.shape == (10_000, 16)
    assert sgd.untyped_storage().nbytes() == 4 and adagrad.untyped_storage().nbytes() == 40_000
    assert element.untyped_storage().nbytes() == 640_000
    assert not sgd.any() and not adagrad.any() and not element.any()
    assert torch.equal(sgd.index_select(0, torch.tensor([0, 9_999, 5])), torch.zeros(3))
    assert [RowOptimizer(kind, 0.1).state_width(16) for kind in ("sgd", "adagrad", "elementwise-adagrad")] == [0, 1, 16]


def spec(sizes: list[int], dim: int, kind: str, device: str = "cpu") -> StoreSpec:
    return StoreSpec(table_sizes=sizes, dim=dim, optimizer=RowOptimizer(kind, 0.1), device=torch.device(device))


@pytest.mark.parametrize("kind,width", [("sgd", 0), ("adagrad", 1), ("elementwise-adagrad", 8)])
def test_stores_state_the_bytes_of_their_rows(kind, width):
    sizes, dim = [100, 23], 8
    n = sum(sizes)
    assert table_bytes(n, dim, width) == 4 * n * (dim + width)
    assert DeviceStore.memory_need(spec(sizes, dim, kind)) == MemoryNeed(host=4 * n * (dim + width))
    assert DeviceStore.memory_need(spec(sizes, dim, kind, "cuda")) == MemoryNeed(4 * n * dim, 4 * n * (dim + width))
    assert HybridStore.memory_need(spec(sizes, dim, kind)) == MemoryNeed(host=4 * n * (dim + width))
    assert HybridStore.memory_need(spec(sizes, dim, kind, "cuda")) == MemoryNeed(host=4 * n * (dim + width))
    freq = spec(sizes, dim, kind, "cuda")
    freq.options = {"cache_ratio": 0.5}
    table = 4 * n * (dim + width)
    assert FreqCacheStore.memory_need(freq) == MemoryNeed(table + 8 * n, table // 2)


@pytest.mark.parametrize("method", ["device", "hybrid"])
def test_the_final_rows_are_the_table_itself_not_a_copy(small_dataset, method):
    cfg = RunConfig.from_dict({**RUN, "method": method, "train": {**RUN["train"], "row_optimizer": "sgd"}})
    result = train(cfg, small_dataset, CPU, progress=False)
    assert result.embedding.data_ptr() == result.store.weight.data_ptr()
    assert torch.equal(result.embedding, result.store.export())


def test_the_checksum_hashes_the_bytes_of_every_tensor():
    named = [("a", torch.arange(6, dtype=torch.float32).reshape(2, 3)), ("b", torch.tensor([1.5, -2.0]))]
    digest = hashlib.sha256()
    for name, t in named:
        digest.update(name.encode())
        digest.update(t.numpy().tobytes())
    assert param_checksum(named) == digest.hexdigest()


def test_bytes_parse_with_binary_suffixes():
    assert memory.parse_bytes("1000", "x") == 1000
    assert memory.parse_bytes("512M", "x") == 512 << 20
    assert memory.parse_bytes("1.5G", "x") == 3 << 29
    assert memory.parse_bytes("2GiB", "x") == 2 << 30
    with pytest.raises(ConfigError, match="HOTCOLD_HOST_MEMORY"):
        memory.parse_bytes("lots", "HOTCOLD_HOST_MEMORY")


def test_the_shortfall_names_the_bytes_needed_and_available():
    roomy = lambda: (10**12, "plenty")  # noqa: E731
    assert memory.shortfall(MemoryNeed(10**9, 0), CPU, "run", host=roomy) is None
    reason = memory.shortfall(MemoryNeed(10**9, 0), CPU, "run", host=lambda: (999, "a test"))
    assert "1000000000 bytes" in reason and "999 bytes" in reason and "host memory" in reason
    # a CUDA device's memory, answered by a fake so that no GPU is needed
    cuda = torch.device("cuda")
    reason = memory.shortfall(MemoryNeed(10, 5000), cuda, "run", host=roomy, dev=lambda d: (4000, "a fake GPU"))
    assert "5000 bytes" in reason and "4000 bytes" in reason and "cuda memory" in reason
    assert memory.shortfall(MemoryNeed(10, 3000), cuda, "run", host=roomy, dev=lambda d: (4000, "fake")) is None


def test_the_machine_reports_its_memory():
    avail, total, source = machine.host_memory()
    if avail is None:
        pytest.skip(f"this system reports no memory figures ({source}): runs are checked only against HOTCOLD_HOST_MEMORY")
    assert 0 < avail <= total


def test_a_budget_from_the_environment_replaces_the_machine(monkeypatch):
    monkeypatch.setenv(memory.HOST_ENV, "3G")
    assert memory.host_budget() == (3 << 30, f"${memory.HOST_ENV}")
    monkeypatch.setenv(memory.HOST_ENV, "")
    monkeypatch.setattr(machine, "host_memory", lambda: (10 << 30, 20 << 30, "a fake machine"))
    budget, source = memory.host_budget()
    assert budget == 8 << 30 and "a fake machine" in source


@pytest.mark.parametrize("method", ["device", "hybrid", "lru", "fae"])
def test_a_run_that_does_not_fit_ends_infeasible_before_allocating(tmp_path, small_dataset, monkeypatch, method):
    need = table_bytes(sum(small_dataset.cardinalities), 8, 1)
    monkeypatch.setenv(memory.HOST_ENV, str(need - 1))

    def no_table(*args, **kwargs):
        raise AssertionError("a table was allocated for a run that does not fit")

    for module in (hotcold.embedding.rows, hotcold.embedding.device, hotcold.embedding.hybrid):
        monkeypatch.setattr(module, "init_table", no_table)
    monkeypatch.setattr("hotcold.embedding.cache.init_table", no_table)
    out = tmp_path / method
    store = {"cache_ratio": 0.4} if method == "lru" else {}
    config = {**RUN, "method": method, "store": store}
    assert main(["train", "--dataset", str(small_dataset.path), "--run-config", json.dumps(config),
                 "--out", str(out), "--no-progress"]) == 0
    record = json.loads((out / "record.json").read_text())
    assert record["status"] == "infeasible"
    assert f"{need} bytes" in record["reason"] and f"{need - 1} bytes" in record["reason"]
    assert "host memory" in record["reason"]


def test_a_run_that_fits_trains(small_dataset, monkeypatch):
    need = table_bytes(sum(small_dataset.cardinalities), 8, 1)
    monkeypatch.setenv(memory.HOST_ENV, str(need))
    cfg = RunConfig.from_dict({**RUN, "method": "hybrid"})
    assert train(cfg, small_dataset, CPU, progress=False).metrics["eval_samples"] == 512
    monkeypatch.setenv(memory.HOST_ENV, str(need - 1))
    with pytest.raises(InfeasibleError, match=f"{need} bytes"):
        train(cfg, small_dataset, CPU, progress=False)


@pytest.mark.parametrize("method", ["lru", "lfu", "freqcache", "belady", "fae", "scratchpipe"])
def test_the_final_rows_of_every_store_are_its_export(small_dataset, method):
    store = {"fae": {"budget_ratio": 0.05, "sample_fraction": 0.2}}.get(method, {"cache_ratio": 0.4})
    if method == "scratchpipe":
        store = {}
    cfg = RunConfig.from_dict({**RUN, "method": method, "store": store})
    result = train(cfg, small_dataset, CPU, progress=False)
    assert torch.equal(result.embedding, result.store.export())
    assert torch.equal(result.store.final_rows(), result.embedding)
