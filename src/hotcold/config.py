"""The typed sections of a run's configuration (model, training, timing, distribution, the verbs' defaults).

A run is one (dataset, method, variant, seed) (``hotcold.run_config``). Each
section is read from a plain mapping by ``from_mapping``, which rejects
unknown keys with a message naming them, so a typo never silently falls
back to a default.

The defaults here are the workflow schema's (``workflows/schemas/config.schema.yaml``),
pinned equal by a test: a verb run by hand behaves as the workflow's
default, and the CLI takes its option defaults from these classes.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import Any, Mapping, Protocol, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration value or key is invalid."""


def parse_yaml(text: str) -> Any:
    """``yaml.safe_load`` of ``text``, by libyaml where PyYAML has it (the workflow's schema: 0.02 s against
    0.16 s); a text that does not parse is parsed again by the Python loader, whose errors say more."""
    import yaml

    fast = getattr(yaml, "CSafeLoader", None)
    if fast is not None:
        try:
            return yaml.load(text, Loader=fast)
        except yaml.YAMLError:
            pass
    return yaml.safe_load(text)


def read_yaml(path: Any) -> Any:
    """A YAML (or JSON) file's data; a ``ConfigError`` naming the file, and the line and column where it does not
    parse."""
    from pathlib import Path

    import yaml

    try:
        return parse_yaml(Path(path).read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or " ".join(str(e).split())
        raise ConfigError(f"{path}{where}: not valid YAML: {problem}") from None


class InfeasibleError(ConfigError):
    """A valid variant that cannot run on this dataset (a cache smaller than a batch's unique rows).

    The training job ends with a record of status ``infeasible`` and this
    message as the reason, instead of failing the workflow.
    """


def is_int(v: Any) -> bool:
    """An integer that is not a bool."""
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def is_real(v: Any) -> bool:
    """A real number that is not a bool."""
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def is_finite(v: Any) -> bool:
    """A finite real number that is not a bool (rejects inf and NaN)."""
    return is_real(v) and math.isfinite(v)


FLOAT32_MAX = 3.4028234663852886e38  # the largest finite float32 (numpy.finfo(numpy.float32).max)
FLOAT32_TINY = 1.401298464324817e-45  # the smallest positive float32 (a subnormal): smaller rounds to 0


def is_float32(v: Any) -> bool:
    """A finite real number that stays finite in float32, where the training step uses it (not a bool)."""
    return is_finite(v) and abs(v) <= FLOAT32_MAX


def is_positive_float32(v: Any) -> bool:
    """A number > 0 that float32 holds as a finite number > 0 (neither overflows nor rounds to 0)."""
    return is_float32(v) and v >= FLOAT32_TINY


def is_positive_int(v: Any) -> bool:
    return is_int(v) and v > 0


def require(cond: bool, where: str, msg: str) -> None:
    """Raise ``ConfigError("<where>: <msg>")`` unless ``cond``."""
    if not cond:
        raise ConfigError(f"{where}: {msg}")


def from_mapping(cls: type[T], data: Mapping[str, Any] | None, where: str, what: str = "key") -> T:
    """Build dataclass ``cls`` from a plain mapping, rejecting unknown keys (``what``: what to call them) by name.

    A class with a ``validate(where)`` method is validated after construction
    (others validate themselves in ``__post_init__``).
    """
    data = dict(data or {})
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(names))
    require(not unknown, where, f"unknown {what}(s) {unknown}; allowed: {sorted(names) or 'none'}")
    try:
        obj = cls(**data)
    except TypeError as e:
        raise ConfigError(f"{where}: {e}") from None
    if hasattr(obj, "validate"):
        obj.validate(where)
    return obj


INTERACTIONS = ("dot", "dcnv2")


@dataclass(frozen=True)
class ModelConfig:
    """DLRM sizes. The bottom MLP's last width must equal ``embedding_dim``. ``interaction``: pairwise dots (the
    seed papers' DLRM) or a low-rank DCNv2 cross network of ``cross_layers`` layers of rank ``cross_rank``
    (MLPerf's DLRM-DCNv2: 3 and 512)."""

    embedding_dim: int = 16
    bottom_mlp: tuple[int, ...] = (64, 16)
    top_mlp: tuple[int, ...] = (64, 32, 1)
    interaction: str = "dot"
    cross_layers: int = 3
    cross_rank: int = 512

    def validate(self, where: str) -> None:
        object.__setattr__(self, "bottom_mlp", tuple(self.bottom_mlp))
        object.__setattr__(self, "top_mlp", tuple(self.top_mlp))
        require(is_positive_int(self.embedding_dim), where,
                 f"embedding_dim must be a positive integer, got {self.embedding_dim!r}")
        require(len(self.bottom_mlp) > 0 and all(is_positive_int(w) for w in self.bottom_mlp),
                 where, f"bottom_mlp must be a non-empty list of positive integers, got {list(self.bottom_mlp)}")
        require(self.bottom_mlp[-1] == self.embedding_dim, where,
                 f"bottom_mlp must end with embedding_dim={self.embedding_dim} (the dense vector joins the "
                 f"embeddings in the interaction), got {list(self.bottom_mlp)}")
        require(len(self.top_mlp) > 0 and all(is_positive_int(w) for w in self.top_mlp)
                 and self.top_mlp[-1] == 1, where,
                 f"top_mlp must be positive integers ending with 1 (the logit), got {list(self.top_mlp)}")
        require(self.interaction in INTERACTIONS, where,
                f"interaction must be one of {list(INTERACTIONS)}, got {self.interaction!r}")
        for key in ("cross_layers", "cross_rank"):
            require(is_positive_int(getattr(self, key)), where,
                    f"{key} must be a positive integer, got {getattr(self, key)!r}")


#: the embeddings' optimizers: SGD, row-wise Adagrad (one float of state a row) and per-element Adagrad (a float
#: an element, MLPerf DLRM-DCNv2's and FBGEMM's ``EXACT_ADAGRAD``)
ROW_OPTIMIZERS = ("sgd", "adagrad", "elementwise-adagrad")
ELEMENTWISE = "elementwise-adagrad"


def row_state_width(row_optimizer: str, dim: int) -> int:
    """Floats of optimizer state each embedding row of ``dim`` weights keeps: none for SGD, one for row-wise
    Adagrad, ``dim`` for per-element Adagrad."""
    if row_optimizer == ELEMENTWISE:
        return int(dim)
    return 1 if row_optimizer == "adagrad" else 0

DENSE_OPTIMIZERS = ("sgd", "adagrad")
SHUFFLES = ("global", "none")
SWITCHES = ("auto", "on", "off")       # train.pipeline, train.cuda_graphs


@dataclass(frozen=True)
class TrainConfig:
    """The training loop: batches, steps, optimizers, evaluation."""

    batch_size: int = 1024
    steps: int = 200
    warmup_steps: int = 20
    lr: float = 0.05          # embedding rows
    dense_lr: float = 0.05    # MLPs
    row_optimizer: str = "adagrad"
    dense_optimizer: str = "adagrad"
    adagrad_eps: float = 1e-8
    eval_batch_size: int = 16384
    eval_samples: int = 0     # 0: the whole test split
    shuffle: str = "global"
    #: prepare step i+1 (read, plan, copy) on a worker thread while step i trains; auto: on a GPU
    pipeline: str = "auto"
    #: replay the dense forward, backward and optimizer as a captured CUDA graph; auto: on a GPU where it captures
    cuda_graphs: str = "auto"

    def validate(self, where: str) -> None:
        for name in ("batch_size", "steps", "eval_batch_size"):
            v = getattr(self, name)
            require(is_positive_int(v), where, f"{name} must be a positive integer, got {v!r}")
        require(is_int(self.warmup_steps) and 0 <= self.warmup_steps < self.steps, where,
                 f"warmup_steps must be in [0, steps={self.steps}), got {self.warmup_steps!r}")
        require(is_int(self.eval_samples) and self.eval_samples >= 0, where,
                 f"eval_samples must be an integer >= 0, got {self.eval_samples!r}")
        for name in ("lr", "dense_lr", "adagrad_eps"):  # the optimizers apply them in float32
            v = getattr(self, name)
            require(is_finite(v) and v > 0, where, f"{name} must be a finite number > 0, got {v!r}")
            require(is_positive_float32(v), where, f"{name} must be within float32's range, "
                    f"{FLOAT32_TINY:.4g} to {FLOAT32_MAX:.4g} (the optimizers apply it in float32), got {v!r}")
        require(self.row_optimizer in ROW_OPTIMIZERS, where,
                 f"row_optimizer must be one of {ROW_OPTIMIZERS}, got {self.row_optimizer!r}")
        require(self.dense_optimizer in DENSE_OPTIMIZERS, where,
                 f"dense_optimizer must be one of {DENSE_OPTIMIZERS}, got {self.dense_optimizer!r}")
        require(self.shuffle in SHUFFLES, where, f"shuffle must be one of {SHUFFLES}, got {self.shuffle!r}")
        for name in ("pipeline", "cuda_graphs"):
            v = getattr(self, name)
            if isinstance(v, bool):  # YAML 1.1 reads a bare on/off as true/false
                object.__setattr__(self, name, "on" if v else "off")
            v = getattr(self, name)
            require(v in SWITCHES, where, f"{name} must be one of {SWITCHES}, got {v!r}")


@dataclass(frozen=True)
class TimingConfig:
    """Phase timing: ``device`` picks the trainer device (and so the timer); ``repeats``: how many times the
    timed part is trained, each time from the same initial state on the same batches."""

    window: int = 50          # steps per CUDA synchronisation
    device: str = "auto"      # auto | cpu | cuda
    repeats: int = 1

    def validate(self, where: str) -> None:
        require(is_positive_int(self.window), where,
                 f"window must be a positive integer, got {self.window!r}")
        require(is_positive_int(self.repeats), where,
                 f"repeats must be a positive integer, got {self.repeats!r}")
        require(self.device in ("auto", "cpu", "cuda"), where,
                 f"device must be auto, cpu or cuda, got {self.device!r}")


#: bytes of one element of each floating type a collective may send
ELEMENT_BYTES = {"float64": 8, "float32": 4, "bfloat16": 2}
#: the choices of ``distributed.wire_dtype``
WIRE_DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class Wire:
    """What the float collectives send: the embedding all-to-alls' vectors and gradients, and the all-reduces.

    ``dtype`` (``distributed.wire_dtype``) is the production choice: float32
    (the default) or bfloat16 for both the all-to-alls and the all-reduces
    (each rank rounds its float32 values to bfloat16 before sending, and the
    all-reduce sums in bfloat16). ``exact`` (``distributed.exact``): the
    all-reduces send and sum float64, so that a sum over ranks does not depend
    on the order the library adds in and a run over P ranks equals its
    one-process reference bit for bit (``World.sync_dense``); the all-to-alls
    stay float32 (they only move values, which float32 carries exactly). Exact
    mode is float32 with float64 reductions, so it refuses bfloat16.
    """

    dtype: str = "float32"
    exact: bool = False

    def __post_init__(self) -> None:
        self.check("distributed")

    def check(self, where: str) -> None:
        if self.dtype not in WIRE_DTYPES:
            raise ConfigError(f"{where}: wire_dtype must be one of {', '.join(WIRE_DTYPES)}, got {self.dtype!r}")
        if not isinstance(self.exact, bool):
            raise ConfigError(f"{where}: exact must be true or false, got {self.exact!r}")
        if self.exact and self.dtype != "float32":
            raise ConfigError(f"{where}: exact true sends float32 all-to-alls and float64 all-reduces; "
                              f"wire_dtype {self.dtype} contradicts it (set wire_dtype float32 or exact false)")

    @property
    def vector_dtype(self) -> str:
        """The all-to-alls' embedding vectors and gradients."""
        return self.dtype

    @property
    def reduce_dtype(self) -> str:
        """The all-reduces' elements (dense, replica and column all-reduces)."""
        return "float64" if self.exact else self.dtype

    @property
    def vector_bytes(self) -> int:
        return ELEMENT_BYTES[self.vector_dtype]

    @property
    def reduce_bytes(self) -> int:
        return ELEMENT_BYTES[self.reduce_dtype]

    def record(self) -> dict[str, Any]:
        """The mode for a run record or a shard-sim row."""
        return {"wire_dtype": self.dtype, "exact": self.exact, "vector_dtype": self.vector_dtype,
                "reduce_dtype": self.reduce_dtype}


BACKENDS = ("auto", "nccl", "gloo")   # distributed.backend (hotcold.devices)
REFERENCES = ("replay", "none")        # distributed.reference
MIN_TIMEOUT_S, MAX_TIMEOUT_S = 1.0, 86_400.0  # a collective's wait: at least a second, at most a day


@dataclass(frozen=True)
class DistributedConfig:
    """The ranks of a run: ``world`` processes (torchrun), ``ranks_per_node`` of them per simulated node.

    ``batch_per_rank``: the samples each rank trains on per step (weak
    scaling); the run's global batch ``train.batch_size`` is then
    ``batch_per_rank x world``. None: ``train.batch_size`` is a fixed global
    batch, split over the ranks.

    ``wire_dtype`` (float32 | bfloat16) is what the collectives send and
    count, ``exact`` true the mode whose all-reduces sum in float64 so that a
    run over P ranks equals its one-process reference
    (``hotcold.distributed.traffic.Wire``).

    ``timeout_s``: how long a rank waits in a collective for the others
    before the run fails, naming the rank(s) that did not answer (a hung or
    stopped rank). Ranks do the same work between collectives, so the
    default leaves ample room for a slow step, an evaluation or a plan.

    ``backend`` (auto | nccl | gloo): the collectives' backend
    (``hotcold.devices``): auto is NCCL on a CUDA trainer (one GPU
    per rank), gloo on the CPU; gloo on a CUDA trainer sends CPU copies, so
    ranks may share a GPU. ``reference`` (replay | none): after a run over
    several ranks, rank 0 replays it with the one-process ``device`` store
    (``replay``, the exactness check), or not (``none``: for tables that do not
    fit one device; the record says exactness was not checked).
    """

    world: int = 1
    ranks_per_node: int = 1
    batch_per_rank: int | None = None
    wire_dtype: str = "float32"
    exact: bool = False
    timeout_s: float = 120.0
    backend: str = "auto"
    reference: str = "replay"

    def validate(self, where: str) -> None:
        require(is_positive_int(self.world), where, f"world must be a positive integer, got {self.world!r}")
        require(self.backend in BACKENDS, where, f"backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        require(self.reference in REFERENCES, where,
                f"reference must be one of {', '.join(REFERENCES)}, got {self.reference!r}")
        require(is_positive_int(self.ranks_per_node) and self.world % self.ranks_per_node == 0, where,
                f"ranks_per_node must be a positive divisor of world={self.world}, got {self.ranks_per_node!r}")
        require(self.batch_per_rank is None or is_positive_int(self.batch_per_rank), where,
                f"batch_per_rank must be a positive integer or null, got {self.batch_per_rank!r}")
        require(is_finite(self.timeout_s) and MIN_TIMEOUT_S <= self.timeout_s <= MAX_TIMEOUT_S, where,
                f"timeout_s must be a number of seconds in [{MIN_TIMEOUT_S:g}, {MAX_TIMEOUT_S:g}], "
                f"got {self.timeout_s!r}")
        self.wire(where)

    def wire(self, where: str = "distributed") -> Wire:
        """The run's ``Wire``: what its collectives send (a bad value: ``ConfigError`` naming the option)."""
        require(isinstance(self.wire_dtype, str) and self.wire_dtype in WIRE_DTYPES, where,
                f"wire_dtype must be one of {', '.join(WIRE_DTYPES)}, got {self.wire_dtype!r}")
        return Wire(self.wire_dtype, self.exact)  # checks exact

    def launch(self) -> tuple[int, int, str, float]:
        """What one launch of ranks fixes (world, ranks_per_node, backend, timeout_s): runs that agree on it can
        share one launch (``hotcold train-group``); each run keeps its own wire, batch and reference."""
        return self.world, self.ranks_per_node, self.backend, float(self.timeout_s)

    def global_batch(self, fixed: int) -> int:
        """The global batch of a step: ``batch_per_rank x world``, or ``fixed`` (train.batch_size) without one."""
        return fixed if self.batch_per_rank is None else self.batch_per_rank * self.world


@dataclass(frozen=True)
class ProfileConfig:
    """Defaults of ``hotcold profile`` (the schema's ``profile`` section)."""

    sample_fraction: float = 1.0
    window: int = 3           # batches per window of the unique-rows-per-window statistic
    batches: int = 200


@dataclass(frozen=True)
class SimulateConfig:
    """Defaults of ``hotcold simulate`` (the schema's ``simulate`` section; policies: every one)."""

    ratios: tuple[float, ...] = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.025, 0.05, 0.1)
    windows: tuple[int, ...] = (1, 2)
    fae_budgets: tuple[float, ...] = (0.062, 0.124, 0.248)   # FAE's 128/256/512 MiB of full Kaggle
    fae_run_lengths: tuple[int | str, ...] = (1, 16, 128, "epoch")
    fae_sample_fraction: float = 1.0
    steps: int | None = None   # batches replayed (the workflow's run config; None: the train section's steps)


@dataclass(frozen=True)
class ShardSimConfig:
    """Defaults of ``hotcold shard-sim`` (the schema's ``distributed.shard_sim`` section)."""

    plans: tuple[str, ...] = ("table", "row", "column", "balanced", "flexshard", "flexshard-device")
    scales: tuple[str, ...] = ("2x1", "2x2", "4x8", "16x8")    # nodes x ranks per node
    headrooms: tuple[float, ...] = (1.0, 1.25, 1.5, 2.0)
    batch_per_rank: int | None = 512   # weak scaling: global batch = 512 x world (None: train.batch_size)
    fixed_batch: bool = True           # also at the fixed global batch train.batch_size, for comparison
    steps: int | None = None           # steps per scale (the workflow's run config; None: distributed.train's)


@dataclass(frozen=True)
class AggregateConfig:
    """Defaults of ``hotcold aggregate`` (the schema's ``aggregate`` section)."""

    exact_rtol: float = 1e-6  # largest relative parameter-sketch distance that counts as exact


class Sections(Protocol):
    """What a run's config holds besides its method and store: its seed and its train, model and distributed
    sections (a ``run_config.RunConfig`` is one). The simulators and the step pipeline read only these, so they
    name this type, not the run config with its registry."""

    seed: int
    train: TrainConfig
    model: ModelConfig
    distributed: DistributedConfig
