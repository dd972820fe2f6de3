"""The ``fbgemm`` peer store: FBGEMM's TBE trains the ``device`` store's model; without the extra, runs are skipped."""
from __future__ import annotations

import json

import pytest
import torch

from hotcold.analysis.run_records import find_records
from hotcold.analysis.tables import aggregate
from hotcold.cli import main
from hotcold.config import ConfigError, InfeasibleError
from hotcold import methods
from hotcold.embedding import fbgemm
from hotcold.embedding.base import NullMarker, StoreSpec
from hotcold.embedding.fbgemm import PeerUnavailableError
from hotcold.embedding.update import RowOptimizer
from hotcold.embedding.rows import init_table

CPU = torch.device("cpu")


@pytest.fixture
def fbgemm_installed() -> None:
    """Skip where the optional extra is missing; asked when a test runs, not at collection (importing FBGEMM
    takes seconds in every test process)."""
    missing = fbgemm.available()
    if missing is not None:
        pytest.skip(f"the optional extra is missing: {missing}")


needs_fbgemm = pytest.mark.usefixtures("fbgemm_installed")


def needs_cuda_fbgemm(test):
    return pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason="needs a GPU and fbgemm_gpu's CUDA build (`pip install -e .[peers-cuda]`): the managed cache and "
               "device placement run on a machine with both")(needs_fbgemm(test))


SIZES = [30, 7, 200]
COLUMNS = [0, 1, 2, 1, 2]  # columns 3 and 4 share tables 1 and 2 with columns 1 and 2, as histories do
RUN = {"dataset": "small", "method": "fbgemm", "variant": "host", "seed": 0,
       "model": {"embedding_dim": 8, "bottom_mlp": [8], "top_mlp": [8, 1]},
       "train": {"steps": 6, "warmup_steps": 2, "batch_size": 64, "eval_batch_size": 256}}


def _ids(gen: torch.Generator, batch: int = 64, pad: float = 0.25) -> torch.Tensor:
    """Skewed ids [B, K] of the COLUMNS' tables, a share ``pad`` of them padding (-1)."""
    cols = [torch.randint(0, SIZES[t], (batch,), generator=gen) // torch.randint(1, 4, (batch,), generator=gen)
            for t in COLUMNS]
    ids = torch.stack(cols, 1)
    ids[torch.rand(ids.shape, generator=gen) < pad] = -1
    return ids


def _spec(kind: str, device: torch.device = CPU, **options) -> StoreSpec:
    return StoreSpec(table_sizes=list(SIZES), dim=8, optimizer=RowOptimizer(kind, lr=0.05), device=device, seed=3,
                     options=options, column_tables=list(COLUMNS))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def test_tbe_inputs_are_feature_major_bags_of_one():
    ids = torch.tensor([[4, -1, 2], [0, 5, -1]])  # [B=2, K=3]
    indices, offsets = fbgemm.tbe_inputs(ids, CPU)
    # bags (k, b): (0,0)=4 (0,1)=0 (1,0)=pad (1,1)=5 (2,0)=2 (2,1)=pad
    assert indices.tolist() == [4, 0, 5, 2]
    assert offsets.tolist() == [0, 1, 2, 2, 3, 4, 4]


def test_table_order_groups_columns_of_a_table():
    assert fbgemm.table_order([0, 1, 1, 2]) is None
    order = fbgemm.table_order(COLUMNS)
    assert order == [0, 1, 3, 2, 4] and [COLUMNS[k] for k in order] == sorted(COLUMNS)


def test_bad_options_fail_clearly():
    with pytest.raises(ConfigError, match="cache must be one of"):
        methods.get("fbgemm").build(_spec("sgd", cache="fifo"))
    with pytest.raises(ConfigError, match="need cache: lru or lfu"):
        methods.get("fbgemm").build(_spec("sgd", cache_ratio=0.1))
    spec = _spec("sgd")
    spec.dim = 6
    with pytest.raises(ConfigError, match="multiple of 4"):
        methods.get("fbgemm").build(spec)


@pytest.mark.parametrize("cache", ["lru", "lfu"])
def test_managed_cache_on_a_cpu_is_infeasible(cache):
    """Whether or not the extra is installed: the run ends as an ``infeasible`` record, not an error."""
    with pytest.raises(InfeasibleError, match="needs a GPU"):
        methods.get("fbgemm").build(_spec("adagrad", cache=cache, cache_ratio=0.05))


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the managed cache trains")
def test_under_auto_the_training_job_records_a_managed_cache_infeasible_on_a_cpu(tmp_path, small_dataset):
    """``timing.device: auto`` is resolved by the job (the workflow plans it as a training run): on a CPU the
    interleaved group writes the same ``infeasible`` record as ``hotcold infeasible`` and trains the others."""
    from hotcold.runs.runner import train_group

    lru = {**RUN, "variant": "lru", "store": {"cache": "lru", "cache_ratio": 0.05}, "timing": {"device": "auto"}}
    device = {**RUN, "method": "device", "variant": "base", "timing": {"device": "auto"}}
    done = train_group([(device, tmp_path / "device"), (lru, tmp_path / "lru")], small_dataset.path, progress=False)
    assert [record["status"] for _, record in done] == ["ok", "infeasible"]
    assert "needs a GPU; this run is on cpu" in done[1][1]["reason"]
    assert (tmp_path / "lru" / "record.json").is_file()


def test_a_managed_cache_on_a_cpu_gets_its_record_without_training(tmp_path, small_dataset, capsys):
    """`hotcold infeasible` (the workflow's one job for such runs): the same record a training job would write."""
    lru = {**RUN, "variant": "lru", "store": {"cache": "lru", "cache_ratio": 0.05}}
    assert methods.get("fbgemm").parse_options(lru["store"]).infeasible_on("cuda") is None
    runs = [{"run_config": lru, "out": str(tmp_path / "lru")}]
    assert main(["infeasible", "--runs", json.dumps(runs), "--data", str(small_dataset.path.parent),
                 "--device", "cpu"]) == 0
    rec = json.loads((tmp_path / "lru" / "record.json").read_text())
    assert rec["status"] == "infeasible" and "needs a GPU; this run is on cpu" in rec["reason"]
    assert rec["dataset_manifest_sha256"] == small_dataset.manifest_sha256 and (tmp_path / "lru/steps.parquet").is_file()
    host = [{"run_config": RUN, "out": str(tmp_path / "host")}]
    assert main(["infeasible", "--runs", json.dumps(host), "--data", str(small_dataset.path.parent),
                 "--device", "cpu"]) == 2
    assert "can run on cpu; train it instead" in capsys.readouterr().err and not (tmp_path / "host").exists()


def test_missing_extra_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(fbgemm, "available", lambda device=None: "fbgemm_gpu is not installed; install it with "
                        f"`{fbgemm.INSTALL_HINT}`")
    with pytest.raises(PeerUnavailableError, match=r"pip install -e \.\[peers\]"):
        methods.get("fbgemm").build(_spec("sgd"))


def test_missing_extra_ends_as_a_skipped_record_named_in_the_summary(monkeypatch, tmp_path, small_dataset):
    monkeypatch.setattr(fbgemm, "available", lambda device=None: "fbgemm_gpu is not installed here (simulated)")
    runs = tmp_path / "runs"
    out = runs / "small" / "fbgemm" / "host" / "seed~0"
    assert main(["train", "--dataset", str(small_dataset.path), "--run-config", json.dumps(RUN),
                 "--out", str(out), "--threads", "1", "--no-progress"]) == 0
    rec = json.loads((out / "record.json").read_text())
    assert rec["status"] == "skipped" and "simulated" in rec["reason"]
    assert not {"summary", "metrics", "params"} & set(rec)
    device = {**RUN, "method": "device", "variant": "base"}
    assert main(["train", "--dataset", str(small_dataset.path), "--run-config", json.dumps(device),
                 "--out", str(runs / "small" / "device" / "base" / "seed~0"), "--threads", "1",
                 "--no-progress"]) == 0
    summary = aggregate(find_records(runs), tmp_path / "tables")
    assert dict(zip(summary.method, summary.status)) == {"device": "ok", "fbgemm": "skipped"}
    text = (tmp_path / "tables" / "summary.md").read_text()
    assert "**Skipped:**" in text and "- `fbgemm` (1 run(s): small/host): fbgemm_gpu is not installed" in text
    listing = (tmp_path / "tables" / "infeasible.md").read_text()
    assert "Skipped" in listing and "small/fbgemm/host/seed~0" in listing


def test_a_group_with_a_missing_peer_trains_the_others(monkeypatch, tmp_path, small_dataset):
    """`hotcold train-group` (timing.interleave): the skipped peer does not stop the group's other runs."""
    monkeypatch.setattr(fbgemm, "available", lambda device=None: "fbgemm_gpu is not installed here (simulated)")
    configs = [{**RUN, "timing": {"repeats": 2}}, {**RUN, "method": "device", "variant": "base",
                                                   "timing": {"repeats": 2}}]
    runs = [{"run_config": c, "out": str(tmp_path / c["method"] / c["variant"])} for c in configs]
    assert main(["train-group", "--dataset", str(small_dataset.path), "--runs", json.dumps(runs),
                 "--no-progress"]) == 0
    peer, device = (json.loads((tmp_path / c["method"] / c["variant"] / "record.json").read_text()) for c in configs)
    assert peer["status"] == "skipped" and "simulated" in peer["reason"]
    assert device["status"] == "ok" and device["summary"]["repeats"] == 2


@needs_fbgemm
@pytest.mark.parametrize("kind", ["sgd", "adagrad", "elementwise-adagrad"])
def test_store_trains_the_device_stores_rows(kind):
    """20 steps with padding and shared tables: FBGEMM's fused update against the ``device`` store."""
    store, ref = methods.get("fbgemm").build(_spec(kind)), methods.get("device").build(_spec(kind))
    assert torch.equal(store.export(), init_table(SIZES, 8, 3))
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        ids = _ids(gen)
        out, want = store.forward(ids, NullMarker()), ref.forward(ids, NullMarker())
        torch.testing.assert_close(out, want, rtol=0, atol=1e-6)
        grad = torch.randn(out.shape, generator=gen)
        store.backward(grad, NullMarker())
        ref.backward(grad, NullMarker())
    assert _rel(store.export(), ref.export()) <= 1e-6
    if kind != "sgd":
        assert _rel(fbgemm.tbe_row_states(store.tbe), ref.state) <= 1e-6
    torch.testing.assert_close(store.lookup(ids), ref.lookup(ids), rtol=0, atol=1e-6)


@needs_fbgemm
def test_host_counters_count_every_lookup_as_resident():
    store = methods.get("fbgemm").build(_spec("sgd"))
    ids = _ids(torch.Generator().manual_seed(1))
    store.backward(store.forward(ids, NullMarker()), NullMarker())
    rows = {(COLUMNS[k], int(i)) for row in ids for k, i in enumerate(row) if i >= 0}
    c = store.step_counters()
    valid = int((ids >= 0).sum())
    assert (c["lookups"], c["unique_rows"], c["hits"], c["unique_hits"]) == (valid, len(rows), valid, len(rows))
    assert c["misses"] == c["param_rows_h2d"] == c["evictions"] == 0
    assert store.report() == {"placement": "host"}


@needs_cuda_fbgemm
@pytest.mark.parametrize("cache", [None, "lru", "lfu"])
@pytest.mark.parametrize("kind", ["sgd", "adagrad"])
def test_cuda_placements_train_the_device_stores_rows(cache, kind):
    cuda = torch.device("cuda")
    options = {} if cache is None else {"cache": cache, "cache_rows": 64}
    store, ref = methods.get("fbgemm").build(_spec(kind, cuda, **options)), methods.get("device").build(_spec(kind, cuda))
    gen = torch.Generator().manual_seed(0)
    total = {"lookups": 0, "misses": 0, "unique_misses": 0}
    steps = []
    for _ in range(20):
        ids = _ids(gen)
        out, want = store.forward(ids, NullMarker()), ref.forward(ids, NullMarker())
        torch.testing.assert_close(out, want, rtol=0, atol=1e-6)
        grad = torch.randn(out.shape, generator=gen).to(cuda)
        store.backward(grad, NullMarker())
        ref.backward(grad, NullMarker())
        steps.append((int((ids >= 0).sum()), store.step_counters()))
    store.settle_counters()  # the managed cache's counts are read once, after the steps
    for valid, c in steps:
        assert c["hits"] + c["misses"] == c["lookups"] == valid
        assert c["unique_hits"] + c["unique_misses"] == c["unique_rows"]
        assert 0 <= c["param_rows_h2d"] <= c["unique_misses"] and 0 <= c["evictions"] <= c["param_rows_h2d"]
        assert c["param_rows_d2h"] == c["evictions"]
        for k in total:
            total[k] += c[k]
    assert _rel(store.export(), ref.export()) <= 1e-5  # CUDA sums gradients in another order
    if cache is not None:
        report = store.report()
        assert report["capacity"] >= 64 and report["cache"] == cache
        assert 0 < total["unique_misses"] <= total["misses"] < total["lookups"]
        if cache == "lru":  # FBGEMM's own statistics count the same unique misses
            assert report["fbgemm_uvm_cache_stats"]["num_unique_misses"] == total["unique_misses"]


@needs_fbgemm
def test_adagrad_epsilon_is_added_outside_the_square_root():
    """With a large eps and small gradients, eps inside the root (sqrt(state + eps)) would change the update by
    about 40%; FBGEMM's rows follow the harness's sqrt(state) + eps to float32 rounding."""
    spec = lambda: StoreSpec(list(SIZES), 8, RowOptimizer("adagrad", 0.05, eps=0.5), CPU, seed=3)  # noqa: E731
    store, ref = methods.get("fbgemm").build(spec()), methods.get("device").build(spec())
    gen = torch.Generator().manual_seed(0)
    for _ in range(10):
        ids = torch.stack([torch.randint(0, n, (64,), generator=gen) for n in SIZES], 1)
        grad = 0.01 * torch.randn(64, len(SIZES), 8, generator=gen)
        store.forward(ids, NullMarker())
        ref.forward(ids, NullMarker())
        store.backward(grad, NullMarker())
        ref.backward(grad, NullMarker())
    change = ref.export().double() - init_table(SIZES, 8, 3).double()
    assert float((store.export().double() - ref.export().double()).norm() / change.norm()) <= 1e-5


# --- FBGEMM on a GPU: the CUDA build, probed; counts read after the timed steps ----------------------------------------
@needs_fbgemm
def test_a_cuda_run_with_the_cpu_wheel_is_skipped_saying_why(monkeypatch):
    """The CPU wheel imports on a GPU machine too: on cuda the installed build is what decides, not the import."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(fbgemm, "installed_builds", lambda: {"fbgemm-gpu-cpu": "1.8.0"})
    reason = fbgemm.available("cuda")
    assert reason is not None and "fbgemm-gpu-cpu==1.8.0" in reason and ".[peers-cuda]" in reason
    assert fbgemm.available("cpu") is None and fbgemm.available() is None
    with pytest.raises(PeerUnavailableError, match="needs its CUDA build"):
        fbgemm.require_available(torch.device("cuda"))  # a PeerUnavailableError: the run's record is `skipped`


@needs_fbgemm
def test_the_cuda_build_is_probed_with_a_forward_not_an_import(monkeypatch):
    """With the CUDA build named but no working GPU (this machine), the tiny TBE forward fails and says so."""
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the probe would pass")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(fbgemm, "installed_builds", lambda: {"fbgemm-gpu": "1.8.0"})
    fbgemm.cuda_probe.cache_clear()
    try:
        reason = fbgemm.available("cuda")
        assert reason is not None and "FBGEMM's CUDA TBE does not run on cuda:0" in reason, reason
        assert ".[peers-cuda]" in reason and "\n" not in reason
    finally:
        fbgemm.cuda_probe.cache_clear()


@needs_cuda_fbgemm
def test_the_cuda_probe_passes_where_the_cuda_build_runs():
    assert fbgemm.available("cuda") is None and fbgemm.available(torch.device("cuda", 0)) is None


class _SetCache:
    """A stand-in for FBGEMM's cache directory: a set of resident rows that holds ``slots`` of them."""

    def __init__(self, slots: int) -> None:
        self.rows: set[int] = set()
        self.slots = slots

    def resident(self, rows: torch.Tensor) -> torch.Tensor:
        return torch.tensor([r in self.rows for r in rows.numpy().tolist()], dtype=torch.bool)

    def occupied(self) -> torch.Tensor:
        return torch.tensor(len(self.rows), dtype=torch.int64)

    def fill(self, rows: list[int]) -> list[int]:
        """Admit the missing ``rows`` (evicting the smallest others when full); the rows it could not admit."""
        batch = set(rows)
        refused = []
        for r in rows:
            if r in self.rows:
                continue
            if len(self.rows) >= self.slots:
                spare = sorted(self.rows - batch)
                if not spare:
                    refused.append(r)
                    continue
                self.rows.discard(spare[0])
            self.rows.add(r)
        return refused


def test_cache_counts_stay_on_the_device_in_the_step_and_are_read_once_after(monkeypatch):
    """The managed cache's per-step counting calls no ``.item()``/``.tolist()``/``int()`` on a tensor (each would
    wait for the GPU inside the step); ``settle`` reads all steps' counts at once, and they equal a count by hand."""
    from hotcold.embedding.rows import Lookup

    cache = _SetCache(slots=6)
    counts = fbgemm.CacheCounts(cache.resident, cache.occupied, CPU, row_bytes=32)
    gen = torch.Generator().manual_seed(4)
    steps, want = [], []
    real_item, real_tolist, real_int = torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__int__
    for _ in range(5):
        rows = torch.randint(0, 12, (10,), generator=gen)
        lk = Lookup(rows, None, (10, 1))
        lk.unique()  # the host's planning (numpy), done before the probe as the store's plan() does
        uniq = sorted(set(rows.tolist()))
        resident_before = set(cache.rows)
        unique_misses = [r for r in uniq if r not in resident_before]
        misses = sum(1 for r in rows.tolist() if r not in resident_before)
        occupied_before = len(cache.rows)

        def no_sync(*a, **k):
            raise AssertionError("read a device count inside the step")
        monkeypatch.setattr(torch.Tensor, "item", no_sync)
        monkeypatch.setattr(torch.Tensor, "tolist", no_sync)
        monkeypatch.setattr(torch.Tensor, "__int__", no_sync)
        counts.before(lk)
        monkeypatch.setattr(torch.Tensor, "tolist", real_tolist)  # the stand-in cache's own bookkeeping
        refused = cache.fill(uniq)
        monkeypatch.setattr(torch.Tensor, "tolist", no_sync)
        steps.append(counts.after(lk.size, len(uniq)))
        monkeypatch.setattr(torch.Tensor, "item", real_item)
        monkeypatch.setattr(torch.Tensor, "tolist", real_tolist)
        monkeypatch.setattr(torch.Tensor, "__int__", real_int)
        fetched = len(unique_misses) - len(refused)
        evictions = fetched - (len(cache.rows) - occupied_before)
        want.append({"lookups": 10, "unique_rows": len(uniq), "misses": misses, "hits": 10 - misses,
                     "unique_misses": len(unique_misses), "unique_hits": len(uniq) - len(unique_misses),
                     "evictions": evictions, "param_rows_h2d": fetched, "param_rows_d2h": evictions,
                     "param_bytes_h2d": 32 * fetched, "param_bytes_d2h": 32 * evictions})
    assert all(c["misses"] is None and c["lookups"] == 10 for c in steps)  # pending until settled
    assert sum(w["evictions"] for w in want) > 0 and sum(w["unique_hits"] for w in want) > 0
    counts.settle()
    for c, w in zip(steps, want):
        assert {k: c[k] for k in w} == w
        assert all(isinstance(v, int) for v in c.values())


@needs_fbgemm
@pytest.mark.parametrize("row_optimizer", ["adagrad", "elementwise-adagrad"])
def test_a_trained_peer_run_is_checked_in_lock_step(tmp_path, small_dataset, row_optimizer):
    """The peer's own rounding is held to a lock-step check against the device store on the run's first batches."""
    out = tmp_path / "fbgemm"
    run = {**RUN, "train": {**RUN["train"], "row_optimizer": row_optimizer}}
    assert main(["train", "--dataset", str(small_dataset.path), "--run-config", json.dumps(run),
                 "--out", str(out), "--threads", "1", "--no-progress"]) == 0
    rec = json.loads((out / "record.json").read_text())
    assert rec["check"] == "lockstep"
    lock = rec["lockstep"]
    assert lock["steps"] == RUN["train"]["steps"] and len(lock["max_diff_per_step"]) == lock["steps"]
    assert lock["ok"] and 0 <= lock["max_diff"] <= lock["atol"]
