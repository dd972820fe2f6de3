"""One run's typed configuration: its dataset, its method with the method's typed options, model, training,
timing and distribution.

A run is one (dataset, method, variant, seed). The workflow passes it as
JSON; ``RunConfig.from_dict`` rejects unknown keys naming them, and parses
the store's options once, through the method registry, into the method's
``StoreOptions``: nothing downstream reads an option by key. The sections'
classes and defaults are ``hotcold.config``'s.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from hotcold import methods
from hotcold.config import (ConfigError, DistributedConfig, ModelConfig, TimingConfig, TrainConfig, from_mapping,
                            is_int)
from hotcold.options.base import NoOptions, StoreOptions


@dataclass(frozen=True)
class RunConfig:
    """Everything that determines one run."""

    dataset: str
    method: str
    variant: str = "base"
    seed: int = 0
    #: the method's typed options: a mapping given here (or none) is parsed once, into the method's ``StoreOptions``
    store: StoreOptions = None  # type: ignore[assignment]
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    timing: TimingConfig = field(default_factory=TimingConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)

    def __post_init__(self) -> None:
        # the one parse of the store's options (a mapping, as read; the method's own options pass as they are)
        object.__setattr__(self, "store", _store_options(self.method, self.store))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RunConfig":
        data = dict(data)
        allowed = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - allowed)
        if unknown:
            raise ConfigError(f"run config: unknown key(s) {unknown}; allowed: {sorted(allowed)}")
        for key in ("dataset", "method"):
            if not isinstance(data.get(key), str) or not data[key]:
                raise ConfigError(f"run config: {key!r} must be a non-empty string")
        seed = data.get("seed", 0)
        if not (is_int(seed) and seed >= 0):
            raise ConfigError(f"run config: seed must be an integer >= 0, got {seed!r}")
        distributed = from_mapping(DistributedConfig, data.get("distributed"), "distributed")
        train = dict(data.get("train") or {})
        if distributed.batch_per_rank is not None:
            weak = distributed.global_batch(0)
            stated = train.setdefault("batch_size", weak)
            if stated != weak:
                raise ConfigError(f"run config: train.batch_size {stated!r} contradicts distributed.batch_per_rank "
                                  f"{distributed.batch_per_rank} x world {distributed.world} = {weak}; "
                                  f"state one of them")
        return cls(
            dataset=data["dataset"],
            method=data["method"],
            variant=str(data.get("variant", "base")),
            seed=int(data.get("seed", 0)),
            store=data.get("store"),
            model=from_mapping(ModelConfig, data.get("model"), "model"),
            train=from_mapping(TrainConfig, train, "train"),
            timing=from_mapping(TimingConfig, data.get("timing"), "timing"),
            distributed=distributed,
        )

    def with_world(self, world: int) -> "RunConfig":
        """This run over ``world`` ranks (``--nproc``): with a per-rank batch, the global batch follows the world."""
        distributed = dataclasses.replace(self.distributed, world=world)
        train = dataclasses.replace(self.train, batch_size=distributed.global_batch(self.train.batch_size))
        return dataclasses.replace(self, distributed=distributed, train=train)

    def to_dict(self) -> dict[str, Any]:
        """The run config as a mapping (JSON, a record's ``config``); ``from_dict`` reads it back equal. The
        store's options are those not at their defaults: what was given, in effect."""
        d = dataclasses.asdict(self)
        d["store"] = {f.name: getattr(self.store, f.name) for f in dataclasses.fields(self.store)
                      if getattr(self.store, f.name) != f.default}
        d["model"]["bottom_mlp"] = list(self.model.bottom_mlp)
        d["model"]["top_mlp"] = list(self.model.top_mlp)
        return d


#: the method of a run config that configures no store (the simulators' and the cost model's)
NO_METHOD = "-"


def _store_options(method: str, data: Any) -> StoreOptions:
    """The method's typed options from the run config's ``store`` (the one parse of a run's options)."""
    if isinstance(data, StoreOptions):
        return methods.get(method).parse_options(data, "run config: store") if method != NO_METHOD else data
    if data is not None and not isinstance(data, Mapping):
        raise ConfigError("run config: store must be a mapping of method options")
    if method == NO_METHOD:
        if data:
            raise ConfigError(f"run config: method {NO_METHOD!r} (no store) takes no store options, got {sorted(data)}")
        return NoOptions()
    return methods.get(method).parse_options(data or {}, "run config: store")
