"""The cost model: a run's counters and a hardware profile -> modelled per-phase step times.

Counters (``hotcold.counters``) say what a step looked up and moved; a
hardware profile says how fast a machine does each kind of work. The model
prices what each technique's code does in each phase as named terms, so that
runs on this machine say what they would take on hardware we do not have (a
V100 + Xeon box, a multi-node A100/H100 cluster) and which term dominates.

Modules: ``profile`` (rates), ``workload`` (what a record says a step did),
``pricing`` (primitive costs, shared blocks), ``techniques`` (one pricing
function per technique), ``collectives`` (a scale-out step's collectives),
``prediction`` (the sum by phase, ranks sharing cores).
"""
from hotcold.costmodel.collectives import (COLLECTIVES, collective_ms, comm_ms, comm_rates, concurrent_ms,
                                           slowest_rank_ms)
from hotcold.costmodel.prediction import STEP_ORDER, Prediction, oversubscription, predict, predict_record
from hotcold.costmodel.pricing import Costs, Terms
from hotcold.costmodel.profile import (
    ALL_RATES,
    COMM_RATES,
    DEVICE_RATES,
    HOST_RATES,
    KINDS,
    SHARED_RATES,
    HardwareProfile,
    Rate,
    load_profile,
    profile_from_dict,
    required_rates,
)
from hotcold.costmodel.techniques import (
    PriceFn,
    price_cache,
    price_device,
    price_fae,
    price_hybrid,
    price_proactive,
    price_scratchpipe,
    price_sharded,
)
from hotcold.costmodel.workload import ModelShape, Workload

__all__ = ["ALL_RATES", "COLLECTIVES", "COMM_RATES", "DEVICE_RATES", "HOST_RATES", "KINDS", "SHARED_RATES",
           "STEP_ORDER", "Costs", "HardwareProfile", "ModelShape", "Prediction", "PriceFn", "Rate", "Terms", "Workload",
           "collective_ms", "comm_ms", "comm_rates", "concurrent_ms", "load_profile", "oversubscription", "predict",
           "predict_record", "price_cache", "price_device", "price_fae", "price_hybrid", "price_proactive",
           "price_scratchpipe", "price_sharded", "profile_from_dict", "required_rates", "slowest_rank_ms"]
