"""TorchRec as the scale-out peer: its planner's plan, its own collectives, and the bytes they send.

``hotcold torchrec-peer`` trains the dataset's embedding tables (pooled sum
bags, one per table, DLRM's sparse arch) with TorchRec's
``DistributedModelParallel`` on P gloo ranks, under the plan TorchRec's
planner picks (``sharding: auto``) or one sharding type forced on every
table. The loss is a fixed random projection of the pooled embeddings, so
every looked-up row gets a gradient; only the embedding collectives run
(no dense model). The batches are shard-sim's: the loader's order, the
global batch cut into P contiguous slices, one per rank.

What TorchRec sends is counted by wrapping ``torch.distributed``'s
collectives while the steps run, with hotcold's conventions
(``distributed.traffic``): a rank's sends to itself cost nothing, an
all-to-all sends each peer its split, a reduce-scatter or all-gather of n
bytes over P ranks is a ring ((P - 1) n / P from each rank), an all-reduce
a ring of both (2 (P - 1) n / P). The bytes are summed over ranks and
steps by collective and element type, so they stand beside shard-sim's
rows for the same batches.

TorchRec is an optional peer: ``available()`` says why it cannot run here.
"""
from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

#: sharding types a run may force on every table (TorchRec's names); ``auto``: its planner chooses. TorchRec
#: 1.8 offers row-wise and table-row-wise (its reduce-scatter protocols) on CUDA devices only, not on a CPU
SHARDINGS = ("auto", "table_wise", "column_wise", "table_column_wise", "data_parallel")


def available() -> str | None:
    """None when TorchRec imports here, else why not (one line)."""
    try:
        import torchrec  # noqa: F401
        from torchrec.distributed.model_parallel import DistributedModelParallel  # noqa: F401
    except Exception as e:  # ImportError, or a wheel built for another torch
        return f"torchrec does not import here ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
    return None


@dataclass
class _Count:
    """One rank's counted sends: bytes and calls by ``collective:dtype``."""

    world: int
    bytes: dict[str, int]
    calls: dict[str, int]

    def add(self, name: str, dtype: Any, nbytes: float) -> None:
        key = f"{name}:{str(dtype).replace('torch.', '')}"
        self.bytes[key] = self.bytes.get(key, 0) + int(nbytes)
        self.calls[key] = self.calls.get(key, 0) + 1


def _a2a_sent(t: Any, splits: Any, rank: int, world: int) -> float:
    """Bytes an ``all_to_all_single`` input sends to the other ranks (its own split stays)."""
    nbytes = t.numel() * t.element_size()
    if not splits:
        return nbytes * (world - 1) / world
    row = nbytes / max(t.shape[0], 1)
    return (sum(splits) - splits[rank]) * row


@contextmanager
def counting(count: _Count, rank: int) -> Iterator[_Count]:
    """Count what this rank sends in TorchRec's collectives while the block runs (see the module docstring)."""
    import torch.distributed as dist

    world = count.world
    ring = (world - 1) / world

    def a2a(output, input, output_split_sizes=None, input_split_sizes=None, *a, **k):
        count.add("all_to_all", input.dtype, _a2a_sent(input, input_split_sizes, rank, world))
        return original["all_to_all_single"](output, input, output_split_sizes, input_split_sizes, *a, **k)

    def reduce_scatter(output, input, *a, **k):
        count.add("reduce_scatter", input.dtype, input.numel() * input.element_size() * ring)
        return original["reduce_scatter_tensor"](output, input, *a, **k)

    def all_gather(output_tensor, input_tensor, *a, **k):
        count.add("all_gather", input_tensor.dtype, input_tensor.numel() * input_tensor.element_size() * (world - 1))
        return original["all_gather_into_tensor"](output_tensor, input_tensor, *a, **k)

    def all_reduce(tensor, *a, **k):
        count.add("all_reduce", tensor.dtype, tensor.numel() * tensor.element_size() * 2 * ring)
        return original["all_reduce"](tensor, *a, **k)

    wrappers = {"all_to_all_single": a2a, "reduce_scatter_tensor": reduce_scatter,
                "all_gather_into_tensor": all_gather, "all_reduce": all_reduce}
    original = {name: getattr(dist, name) for name in wrappers}
    try:
        for name, fn in wrappers.items():
            setattr(dist, name, fn)
        yield count
    finally:
        for name, fn in original.items():
            setattr(dist, name, fn)


@contextmanager
def through_python(count: _Count) -> Iterator[None]:
    """Every ``DistributedDataParallel`` built in the block (TorchRec wraps its data-parallel tables in one)
    all-reduces its gradient buckets through ``torch.distributed.all_reduce``, where ``counting`` sees them
    (DDP's own reducer calls the process group directly); the result is DDP's, the mean."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    def hook(state, bucket):              # unannotated: DDP checks a hook's annotations, and these would be strings
        t = bucket.buffer()
        fut = dist.all_reduce(t.div_(count.world), async_op=True).get_future()
        return fut.then(lambda f: f.value()[0])

    init = DistributedDataParallel.__init__

    def hooked_init(self, *a, **k):
        init(self, *a, **k)
        self.register_comm_hook(None, hook)

    DistributedDataParallel.__init__ = hooked_init
    try:
        yield
    finally:
        DistributedDataParallel.__init__ = init


def _tables(cardinalities: list[int], dim: int, device: Any) -> Any:
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, PoolingType

    configs = [EmbeddingBagConfig(name=f"t{i}", embedding_dim=dim, num_embeddings=int(n), feature_names=[f"f{i}"],
                                  pooling=PoolingType.SUM) for i, n in enumerate(cardinalities)]
    return EmbeddingBagCollection(tables=configs, device=device)


def _plan(ebc: Any, world: int, ranks_per_node: int, sharding: str) -> Any:
    import torch.distributed as dist
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology

    constraints = None
    if sharding != "auto":
        constraints = {f"t{i}": ParameterConstraints(sharding_types=[sharding])
                       for i in range(len(ebc.embedding_bag_configs()))}
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=world, local_world_size=ranks_per_node,
                                                         compute_device="cpu"),
                                       constraints=constraints)
    return planner.collective_plan(ebc, [EmbeddingBagCollectionSharder()], dist.group.WORLD)


def _plan_table(plan: Any) -> list[dict[str, Any]]:
    """Per table: TorchRec's sharding type, kernel and shards ([rank, rows, columns] each; none for a
    data-parallel table, which every rank holds whole)."""
    out = []
    for module_plan in plan.plan.values():
        for name, p in module_plan.items():
            shards = [[int(m.placement.rank()), int(m.shard_sizes[0]), int(m.shard_sizes[1])]
                      for m in (p.sharding_spec.shards if p.sharding_spec is not None else [])]
            out.append({"table": name, "sharding_type": p.sharding_type, "compute_kernel": p.compute_kernel,
                        "shards": shards})
    return sorted(out, key=lambda r: int(r["table"][1:]))


def run_rank(dataset: str | Path, run_config: Any, sharding: str, batch_per_rank: int,
             ranks_per_node: int) -> dict[str, Any] | None:
    """One rank's part of a launched run; rank 0 gets the run's result (the others None)."""
    import torch
    import torch.distributed as dist
    from torchrec import KeyedJaggedTensor
    from torchrec.distributed.model_parallel import DistributedModelParallel

    from hotcold.data.format import Dataset
    from hotcold.distributed.comm import init_process_group
    from hotcold.data.order import table_batches

    torch.set_num_threads(1)
    rank, world, _ = init_process_group(torch.device("cpu"))
    ds = Dataset.open(dataset)
    if ds.sequence:
        raise ValueError(f"{dataset}: torchrec-peer runs DLRM-style datasets (one id per table and sample); "
                         "this one has histories")
    cfg = run_config
    dim, tables = cfg.model.embedding_dim, ds.num_tables
    torch.manual_seed(cfg.seed)
    ebc = _tables(ds.cardinalities, dim, torch.device("meta"))
    plan = _plan(ebc, world, ranks_per_node, sharding)
    count = _Count(world, {}, {})
    with through_python(count):
        model = DistributedModelParallel(ebc, device=torch.device("cpu"), plan=plan)
    projection = torch.randn(tables * dim, generator=torch.Generator().manual_seed(cfg.seed))
    keys = [f"f{i}" for i in range(tables)]
    steps = 0
    with counting(count, rank):
        for batch in table_batches(ds, cfg, batch_per_rank * world):
            ids = np.split(np.asarray(batch, dtype=np.int64), world)[rank]            # [b, K] this rank's slice
            values = torch.from_numpy(np.ascontiguousarray(ids.T).reshape(-1))       # feature-major, as KJT wants
            kjt = KeyedJaggedTensor.from_lengths_sync(keys=keys, values=values,
                                                      lengths=torch.ones(values.numel(), dtype=torch.int64))
            pooled = model(kjt)
            pooled = pooled.wait() if hasattr(pooled, "wait") else pooled
            (pooled.values() @ projection).sum().backward()
            steps += 1
    every = [None] * world
    dist.all_gather_object(every, (count.bytes, count.calls))
    dist.barrier()
    if rank != 0:
        return None
    total: dict[str, int] = {}
    calls: dict[str, int] = {}
    for b, c in every:
        for k, v in b.items():
            total[k] = total.get(k, 0) + v
        for k, v in c.items():
            calls[k] = calls.get(k, 0) + v
    return {"dataset": ds.name, "world": world, "ranks_per_node": ranks_per_node, "sharding": sharding,
            "batch_per_rank": batch_per_rank, "global_batch": batch_per_rank * world, "steps": steps, "dim": dim,
            "plan": _plan_table(plan), "bytes": total, "calls": calls,
            "bytes_per_step": {k: v / max(steps, 1) for k, v in total.items()}}


def write_result(result: dict[str, Any], out: Path) -> None:
    from hotcold.files import atomic_write_text

    atomic_write_text(Path(out), json.dumps(result, indent=2) + "\n")
