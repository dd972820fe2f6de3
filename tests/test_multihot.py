"""Multi-hot features: a table's bag of ids a sample, sum-pooled (MLPerf's DLRM-DCNv2 data)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from hotcold import methods
from hotcold.data.columns import DatasetError
from hotcold.data.format import Dataset, write_dataset
from hotcold.embedding.base import StoreSpec
from hotcold.embedding.device import DeviceStore
from hotcold.embedding.update import RowOptimizer
from hotcold.model.bags import BagPool
from hotcold.train import train
from test_stores import run_cfg

SIZES, BAGS = [20, 5, 40], [3, 1, 6]


def test_a_multi_hot_dataset_lays_each_tables_bag_side_by_side(multihot_dataset):
    ds = multihot_dataset
    assert ds.bags == [3, 1, 4, 2] and ds.sparse.shape[1] == 10
    assert ds.column_tables == [0, 0, 0, 1, 2, 2, 2, 2, 3, 3]
    ids = ds.batch_ids(np.arange(8))
    assert ids.shape == (8, 10) and (ids[:, 0] == ids[:, 1]).all()  # the fixture's repeated ids within a bag
    assert (ds.global_ids(np.arange(8))[:, 8:] >= sum(ds.cardinalities[:3])).all()  # table 3's rows


def test_bag_pool_is_an_embedding_bag_sum_over_each_tables_bag():
    """The device store's lookups pooled by ``BagPool`` equal ``nn.EmbeddingBag(mode="sum")`` per table."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.cat([torch.randint(0, n, (16, k), generator=gen) for n, k in zip(SIZES, BAGS)], dim=1)
    ids[:, 2] = ids[:, 0]  # a repeated id within a bag counts twice
    spec = StoreSpec(table_sizes=SIZES, dim=4, optimizer=RowOptimizer("sgd", 0.1), device=torch.device("cpu"),
                     column_tables=[t for t, k in enumerate(BAGS) for _ in range(k)])
    store = DeviceStore(spec)
    pooled = BagPool(BAGS)(store.lookup(ids))
    weights = store.export()
    starts = np.cumsum([0] + BAGS)
    for t, (n, k) in enumerate(zip(SIZES, BAGS)):
        bag = nn.EmbeddingBag(n, 4, mode="sum")
        bag.weight.data = weights[sum(SIZES[:t]): sum(SIZES[:t]) + n].clone()
        torch.testing.assert_close(pooled[:, t], bag(ids[:, starts[t]: starts[t] + k]), rtol=1e-6, atol=1e-7)


def test_bag_pool_hands_every_column_its_bags_gradient():
    emb = torch.randn(3, sum(BAGS), 2, requires_grad=True)
    grad = torch.randn(3, len(BAGS), 2)
    BagPool(BAGS)(emb).backward(grad)
    expected = torch.cat([grad[:, t:t + 1].expand(-1, k, -1) for t, k in enumerate(BAGS)], dim=1)
    assert torch.equal(emb.grad, expected)


def test_training_on_bags_learns_and_every_bag_is_pooled(multihot_dataset):
    result = train(run_cfg("device", steps=80), multihot_dataset, torch.device("cpu"), progress=False)
    assert result.model.pool is not None and result.model.pool.bags == (3, 1, 4, 2)
    assert result.metrics["auc"] > 0.6


@pytest.mark.parametrize("bags, message", [
    ([3, 1], "bags must give every table"),          # a table without its bag size
    ([3, 0, 1], "bags must give every table"),       # an empty bag
    ([2, 1, 1], r"sparse must be \[N, 4\]"),         # the columns say otherwise
])
def test_a_writer_refuses_bags_that_do_not_fit_the_columns(tmp_path, bags, message):
    sparse = np.zeros((10, 5), np.int32)
    with pytest.raises(DatasetError, match=message):
        write_dataset(tmp_path / "d", dense=np.zeros((10, 1), np.float32), sparse=sparse,
                      labels=np.zeros(10, np.float32), cardinalities=[4, 4, 4], splits={"train": (0, 8),
                      "test": (8, 10)}, meta={}, bags=bags)


def test_an_id_outside_its_table_is_named_with_its_bags_table(tmp_path, multihot_dataset):
    import shutil

    path = tmp_path / "copy"
    shutil.copytree(multihot_dataset.path, path)
    sparse = np.load(path / "sparse.npy", mmap_mode="r+")
    sparse[5, 4] = 7  # column 4 is table 2's first (300 rows)... in range; column 3 is table 1's (7 rows)
    sparse[6, 3] = 7
    sparse.flush()
    del sparse
    with pytest.raises(DatasetError, match=r"id 7 at row 6, column 3 is outside \[0, 7\) of table 1"):
        Dataset.open(path)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["bags"] = [3, 1, 4]
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DatasetError, match="bags must list, for each of the 4 tables"):
        Dataset.open(path)


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Dataset:
    from hotcold.data.generators import GeneratorConfig, generate

    path = tmp_path_factory.mktemp("generated") / "multihot"
    generate(GeneratorConfig(kind="criteo-multihot-style", rows=6000, max_rows_per_table=500, seed=3), path,
             progress=False)
    return Dataset.open(path)


def test_the_generated_bags_are_mlperfs(generated):
    from hotcold.data.generators.bags import extra_ids
    from hotcold.data.generators.config import MLPERF_BAGS, MLPERF_CARDINALITIES

    ds = generated
    assert ds.bags == MLPERF_BAGS and ds.sparse.shape == (6000, 214)
    assert ds.cardinalities == [min(c, 500) for c in MLPERF_CARDINALITIES]
    starts = np.cumsum([0] + MLPERF_BAGS)
    ids = np.asarray(ds.sparse)
    for t in (0, 20, 21):  # 40M rows each, capped: bags of 3, 100 and 27
        first, rows = ids[:, starts[t]], ds.cardinalities[t]
        for j in range(1, MLPERF_BAGS[t]):  # the construction: a fixed function of (seed, table, first id, position)
            assert np.array_equal(ids[:, starts[t] + j], extra_ids(first, 3, t, j, rows))


def test_the_first_ids_keep_the_skew_and_the_others_are_uniform(generated):
    ds = generated
    t, rows = 20, ds.cardinalities[20]       # bag of 100 over 500 rows
    start = sum(ds.bags[:t])
    ids = np.asarray(ds.sparse[:, start:start + 100])
    first = np.bincount(ids[:, 0], minlength=rows)
    assert np.sort(first)[::-1][:5].sum() > 0.2 * len(ids)  # power law: the top 1% of rows, a fifth of the lookups
    bags = ids[np.unique(ids[:, 0], return_index=True)[1]]  # one bag per distinct first id: the extras of each
    extra = np.bincount(bags[:, 1:].ravel(), minlength=rows)
    expected = bags[:, 1:].size / rows
    chi2 = float(((extra - expected) ** 2 / expected).sum())
    assert chi2 < rows + 5 * np.sqrt(2 * rows)  # uniform: chi-square with rows-1 degrees of freedom, 5 sigma
    same = ids[:, 0] == ids[0, 0]
    assert (ids[same] == ids[0]).all()       # one first id, one bag, wherever it occurs


def test_the_cross_network_is_dcnv2s_low_rank_formula():
    """x_{l+1} = x0 * (W_l (V_l x_l) + b_l) + x_l, written out with the layers' own matrices."""
    from hotcold.model.dcnv2 import LowRankCross

    torch.manual_seed(0)
    cross = LowRankCross(width=12, layers=3, rank=4).double()
    x0 = torch.randn(5, 12, dtype=torch.float64)
    x = x0
    for down, up in zip(cross.down, cross.up):
        V, W, b = down.weight, up.weight, up.bias          # [r, D'], [D', r], [D']
        x = x0 * ((x @ V.T) @ W.T + b) + x
    torch.testing.assert_close(cross(x0), x, rtol=0, atol=1e-12)


def test_dcnv2_trains_on_bags_and_is_refused_on_histories(multihot_dataset, sequence_dataset):
    from hotcold.config import ConfigError
    from hotcold.model import build_model
    from hotcold.run_config import RunConfig

    model = {"embedding_dim": 8, "bottom_mlp": [16, 8], "top_mlp": [32, 16, 1], "interaction": "dcnv2",
             "cross_layers": 2, "cross_rank": 6}
    cfg = RunConfig.from_dict({**run_cfg("device", steps=80).to_dict(), "model": model})
    result = train(cfg, multihot_dataset, torch.device("cpu"), progress=False)
    assert type(result.model).__name__ == "DCNv2" and result.metrics["auc"] > 0.6
    with pytest.raises(ConfigError, match="interaction 'dcnv2' is for Criteo-shaped data"):
        build_model(sequence_dataset, cfg.model)


def test_the_cost_model_counts_the_bags_and_mlperfs_cross_network():
    from hotcold.costmodel.workload import ModelShape
    from hotcold.data.generators.config import MLPERF_BAGS

    mlperf = ModelShape(13, 26, 128, (512, 256, 128), (1024, 1024, 512, 256, 1), bags=tuple(MLPERF_BAGS),
                        interaction="dcnv2", cross_layers=3, cross_rank=512)
    assert mlperf.id_columns == 214
    # the figure: about 96 MFLOP a sample forward and backward
    assert 90e6 < mlperf.flops_per_sample() < 100e6
    matmuls = 2 * (13 * 512 + 512 * 256 + 256 * 128 + 3 * 2 * 3456 * 512 + 3456 * 1024 + 1024 * 1024
                   + 1024 * 512 + 512 * 256 + 256)
    assert mlperf.flops_per_sample() == pytest.approx(3 * (matmuls + 3 * 3 * 3456 + (214 - 26) * 128))


@pytest.mark.parametrize("method", [m for m in methods.names(spans_ranks=False, peer=False) if m != "device"])
def test_every_store_trains_devices_bits_on_bags_of_repeated_ids(multihot_dataset, method):
    """Bit for bit, not within a tolerance: a repeated id in a bag is two lookups of one row, summed in the
    same fixed order by every store."""
    got = train(run_cfg(method, steps=30), multihot_dataset, torch.device("cpu"), progress=False)
    ref = train(run_cfg("device", steps=30), multihot_dataset, torch.device("cpu"), progress=False, order=got.order)
    for (name, a), (_, b) in zip(got.named_parameters(), ref.named_parameters()):
        assert torch.equal(a, b), name


def write_mlperf_days(root, days=(0, 1, 2), n=(7, 5, 6), seed=0):
    """MLPerf's materialized layout: per day, dense and labels .npy, and the 26 bags in an uncompressed .npz whose
    members are 0.npy .. 25.npy (np.savez of {"0": ..., ...})."""
    from hotcold.data.generators.config import MLPERF_BAGS, MLPERF_CARDINALITIES

    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    written = {}
    for day, rows in zip(days, n):
        dense = np.log(rng.integers(0, 50, (rows, 13)) + 3).astype(np.float32)
        labels = rng.integers(0, 2, (rows, 1)).astype(np.int32)
        bags = {f"{t}": rng.integers(0, 2 * min(c, 1000), (rows, k)).astype(np.int32)  # some ids over the rows
                for t, (c, k) in enumerate(zip(MLPERF_CARDINALITIES, MLPERF_BAGS))}
        np.save(root / f"day_{day}_dense.npy", dense)
        np.save(root / f"day_{day}_labels.npy", labels)
        np.savez(root / f"day_{day}_sparse_multi_hot.npz", **bags)
        written[day] = (dense, labels, bags)
    return written


def test_mlperfs_materialized_days_are_read_bag_by_bag_the_last_halved(tmp_path):
    from hotcold.data.generators.config import MLPERF_BAGS, MLPERF_CARDINALITIES
    from hotcold.data.sources.prepare import fetch, preprocess
    from hotcold.data.sources.source_config import SourceConfig

    days = write_mlperf_days(tmp_path / "mlperf")
    cfg = SourceConfig.from_dict({"kind": "mlperf-multihot", "path": str(tmp_path / "mlperf"), "days": [0, 1, 2]})
    fetch(cfg, tmp_path / "raw", name="mlperf", progress=False)
    preprocess(cfg, tmp_path / "raw", tmp_path / "ds", name="mlperf", progress=False)
    ds = Dataset.open(tmp_path / "ds", verify=True)
    assert ds.bags == MLPERF_BAGS and ds.cardinalities == MLPERF_CARDINALITIES and len(ds.labels) == 18
    assert ds.split("train") == (0, 12) and ds.split("val") == (12, 15) and ds.split("test") == (15, 18)
    starts = np.cumsum([0] + MLPERF_BAGS)
    dense, labels, bags = days[1]
    assert np.array_equal(ds.dense[7:12], dense) and np.array_equal(ds.labels[7:12], labels[:, 0])
    for t in (0, 5, 20):  # each id modulo its table's rows, as MLPerf's reader hashes them
        assert np.array_equal(ds.sparse[7:12, starts[t]:starts[t + 1]], bags[f"{t}"] % MLPERF_CARDINALITIES[t])


def test_a_missing_or_compressed_mlperf_file_is_named(tmp_path):
    from hotcold.data.generators.config import MLPERF_CARDINALITIES
    from hotcold.data.sources.mlperf import read_mlperf

    days = write_mlperf_days(tmp_path / "m", days=(0, 1), n=(3, 2))
    (tmp_path / "m" / "day_1_labels.npy").unlink()
    with pytest.raises(DatasetError, match=r"day_1_labels.npy: missing \(MLPerf's materialized day 1\)"):
        read_mlperf(tmp_path / "m", tmp_path / "out", [0, 1], MLPERF_CARDINALITIES, progress=False)
    np.savez_compressed(tmp_path / "m" / "day_0_sparse_multi_hot.npz", **days[0][2])
    with pytest.raises(DatasetError, match=r"day_0_sparse_multi_hot.npz: 0.npy is compressed"):
        read_mlperf(tmp_path / "m", tmp_path / "out", [0, 1], MLPERF_CARDINALITIES, progress=False)
    assert not (tmp_path / "out").exists()
