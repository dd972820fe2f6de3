"""The trainer device's runtime: side streams, events, pinned host memory, copies back, and the host's waits.

The stores and the step pipeline ask a ``Runtime`` (``runtime(device)``),
not ``torch.cuda``, for what a step on a GPU needs, so that one code path
runs in three settings:

- on ``cuda``: CUDA's streams, events and pinned memory;
- on ``meta``: the host's own work alone. Meta tensors have shapes but no
  values, so whatever the device would compute costs nothing and a step
  times what the host does; streams and events are stand-ins. Reading device
  values on the host (a scalar, a data-dependent shape, a copy back without
  a runtime) fails there, as it would stall a GPU (``hotcold bench step
  --device meta``);
- the GPU path on the CPU (``gpu_path_on_cpu``): the same stand-ins over CPU
  tensors, so that tests check the GPU path's decisions and bits without a
  GPU.

Without offloading (a CPU trainer) the stores take their host paths and
never ask for a stream. Every wait of the host for the device (an event's or
a stream's ``synchronize``) goes through ``Runtime.wait`` and is counted per
thread and reason (``waits``): the training step's budget on a GPU is none.
"""
from __future__ import annotations

import collections
import contextlib
import threading
from typing import Any, Iterator

import torch

_LOCK = threading.Lock()
_WAITS: collections.Counter[tuple[str, str]] = collections.Counter()  # (thread name, reason) -> host waits
_CPU_OFFLOADED = [False]  # inside ``gpu_path_on_cpu``


def normal_device(device: torch.device | str) -> torch.device:
    """``device`` with an index: ``cuda`` becomes ``cuda:<current index>``; ``cpu`` and indexed devices stay.

    One GPU has one name: ``torch.device("cuda") != torch.device("cuda:0")``, so a store that keys a cache by
    device, or compares its device with a tensor's, would otherwise see two devices where there is one and ship
    the same tensor twice.

    Without a usable GPU a bare ``cuda`` is returned as it is (no tensor can
    live there to be compared with it).
    """
    device = torch.device(device)
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return device


def waits() -> dict[tuple[str, str], int]:
    """The host's waits for the device so far: (thread name, reason) -> count."""
    with _LOCK:
        return dict(_WAITS)


def waits_since(before: dict[tuple[str, str], int]) -> dict[tuple[str, str], int]:
    """The waits counted after the snapshot ``before`` (``waits()``), zeros left out."""
    now = waits()
    return {k: n - before.get(k, 0) for k, n in now.items() if n - before.get(k, 0)}


def _count(reason: str) -> None:
    with _LOCK:
        _WAITS[(threading.current_thread().name, reason)] += 1


class StandInEvent:
    """An event of a device without CUDA: recorded and waited for at once; its waits are counted."""

    def record(self, stream: Any = None) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        _count("event")

    def wait(self, stream: Any = None) -> None:
        pass

    def elapsed_time(self, other: "StandInEvent") -> float:
        return 0.0


class StandInStream:
    """A stream of a device without CUDA: its work runs where it is issued, in order."""

    def wait_event(self, event: Any) -> None:
        pass

    def wait_stream(self, stream: Any) -> None:
        pass

    def record_event(self, event: Any = None) -> Any:
        return event if event is not None else StandInEvent()

    def synchronize(self) -> None:
        _count("stream")


class Runtime:
    """What a store needs of its trainer device beyond tensors, one object per device (``runtime``).

    ``offloaded``: the trainer device is not the host's memory (a GPU, or a
    stand-in for one): stores keep their device and host tensors apart,
    copy between them on streams and decide on the device what it can
    decide. ``values``: device tensors hold values (not ``meta``).
    """

    def __init__(self, device: torch.device, offloaded: bool) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.offloaded = offloaded
        self.values = device.type != "meta"
        self._current = StandInStream()
        self._registered: dict[int, torch.Tensor] = {}  # data pointer -> host tensor registered by ``host_view``

    def __repr__(self) -> str:
        return f"Runtime({self.device}, offloaded={self.offloaded})"

    def stream(self) -> Any:
        """A new side stream."""
        return torch.cuda.Stream(self.device) if self.cuda else StandInStream()

    def current_stream(self) -> Any:
        return torch.cuda.current_stream(self.device) if self.cuda else self._current

    def on(self, stream: Any) -> contextlib.AbstractContextManager:
        """Within: this thread's device work goes to ``stream``."""
        return torch.cuda.stream(stream) if self.cuda else contextlib.nullcontext()

    def event(self, timing: bool = False) -> Any:
        return torch.cuda.Event(enable_timing=timing) if self.cuda else StandInEvent()

    def recorded(self, stream: Any = None) -> Any:
        """An event recorded now on ``stream`` (default: the current one)."""
        ev = self.event()
        ev.record(stream if stream is not None else self.current_stream())
        return ev

    def empty_host(self, *shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A host buffer the device copies into and out of without blocking: pinned on CUDA."""
        return torch.empty(shape, dtype=dtype, pin_memory=self.cuda)

    def pin(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` in memory the device copies from without blocking (pinned on CUDA; as it is elsewhere)."""
        return t.pin_memory() if self.cuda and not t.is_pinned() else t

    def copy_to_host(self, dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        """Queue the copy of device tensor ``src`` into host buffer ``dst`` (from ``empty_host``); returns ``dst``.

        Its values are there once an event recorded after it is waited for
        (``wait``). On ``meta`` nothing is copied: ``dst`` keeps what it held.
        """
        if self.values:
            dst.copy_(src, non_blocking=self.cuda)
        return dst

    def host_view(self, t: torch.Tensor) -> torch.Tensor:
        """Host tensor ``t`` as a tensor of this device that its kernels read and write in place (FBGEMM's host
        memory the GPU addresses): on CUDA ``t``'s memory registered with the driver (``close_view`` gives it
        back) and seen through unified addressing; on the CPU ``t`` itself; on meta a tensor of its shape."""
        if not self.values:
            return torch.empty_like(t, device=self.device)
        if not self.cuda:
            return t
        if not t.is_contiguous():
            raise ValueError("host_view needs a contiguous tensor")
        if not t.is_pinned():  # 1 | 2: cudaHostRegisterPortable | cudaHostRegisterMapped
            err = torch.cuda.cudart().cudaHostRegister(t.data_ptr(), t.numel() * t.element_size(), 3)
            if int(err) != 0:
                raise RuntimeError(f"cudaHostRegister failed ({err})")
            self._registered[t.data_ptr()] = t
        return torch.as_tensor(_DeviceAddressed(t), device=self.device)

    def close_view(self, t: torch.Tensor) -> None:
        """Give back what ``host_view`` registered for ``t`` (nothing where it registered nothing)."""
        if self._registered.pop(t.data_ptr(), None) is not None:
            torch.cuda.cudart().cudaHostUnregister(t.data_ptr())

    def wait(self, what: Any, reason: str) -> None:
        """The host waits for an event or a stream to finish: counted as ``reason`` on this thread."""
        _count(reason)
        if isinstance(what, (StandInEvent, StandInStream)):
            return
        what.synchronize()


class _DeviceAddressed:
    """Host memory the GPU addresses, described as CUDA memory (``__cuda_array_interface__``) for ``torch.as_tensor``;
    the tensor made from it holds this object, and so the host tensor, alive."""

    _TYPES = {torch.float32: "<f4", torch.float64: "<f8", torch.int64: "<i8", torch.int32: "<i4"}

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t
        self.__cuda_array_interface__ = {"shape": tuple(t.shape), "typestr": self._TYPES[t.dtype],
                                         "data": (t.data_ptr(), False), "version": 2, "strides": None}


_RUNTIMES: dict[tuple[torch.device, bool], Runtime] = {}


def runtime(device: torch.device | str) -> Runtime:
    """The runtime of ``device``: offloaded on ``cuda`` and ``meta``, and on the CPU inside ``gpu_path_on_cpu``."""
    device = torch.device(device)
    offloaded = device.type != "cpu" or _CPU_OFFLOADED[0]
    key = (device, offloaded)
    with _LOCK:
        if key not in _RUNTIMES:
            _RUNTIMES[key] = Runtime(device, offloaded)
        return _RUNTIMES[key]


@contextlib.contextmanager
def gpu_path_on_cpu() -> Iterator[None]:
    """Within: a CPU trainer built here takes the GPU path (stand-in streams and events over CPU tensors).

    What is built inside keeps its runtime; tests use it to check the GPU
    path's decisions and bits on a machine without a GPU.
    """
    before = _CPU_OFFLOADED[0]
    _CPU_OFFLOADED[0] = True
    try:
        yield
    finally:
        _CPU_OFFLOADED[0] = before
