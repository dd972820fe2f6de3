"""Compiled kernels when numba is installed (the optional ``fast`` extra), the same code as plain Python otherwise.

``jit(fn)`` compiles ``fn`` with numba (``nogil``) or returns it unchanged;
``KERNEL`` says which runs. Compiled code is cached beside the module
(``__pycache__``), so only the first process after a change pays the compile. A compiled kernel keeps its Python source as
``kernel.py_func``, so tests can check the two agree on small inputs. The
one-pass LRU curve (``trace.stackdist``) keeps its own switch: its test
re-imports it with numba hidden.

What a cold compile costs (seconds a kernel, in every process that finds no
cache) comes mostly from what a kernel calls:

- numba's own ``np.sort``, ``np.argsort``, ``np.partition``, ``np.diff`` and
  ``np.searchsorted``, and an array assigned to a slice (``a[i:j] = b``: a
  shape check with a formatted message), take seconds each: kernels use
  ``hotcold.sorting`` and loops instead;
- a compiled function called with a literal integer (``f(a, 0)``), or with a
  loop variable that starts at one (``pos = 0``), is compiled for
  ``Literal[int](0)`` besides ``int64``: such arguments start as
  ``np.int64(0)``.

Processes that start the same uncompiled kernel at once (the workflow's jobs and
the test workers in a fresh clone) compile it one at a time: the first compiles
and writes the cache, the others then load it (``one_compile_at_a_time``).
Without this, two or three processes each compiled the same kernels, the
longest for 6 s each.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, TypeVar

try:
    import fcntl
except ImportError:  # not on Windows: there each process compiles for itself
    fcntl = None

try:
    import numba
except ImportError:  # optional: the same kernels run as plain Python
    numba = None

#: "numba" when kernels are compiled, "python" when they run interpreted
KERNEL = "numba" if numba is not None else "python"

F = TypeVar("F", bound=Callable)


_HELD: set[Path] = set()   # the compile locks this process holds (a kernel compiled inside another's compile)


def one_compile_at_a_time(dispatcher):
    """``dispatcher`` (a cached numba kernel) compiling a new signature under an exclusive lock on a file beside
    its cache: a process that finds the lock taken waits, then loads what the holder wrote (numba's ``compile``
    looks in the cache first). The lock is taken inside numba's own compiler lock, so a process's threads never
    wait on each other's file locks; a kernel compiled while compiling another takes its own. Where the cache has
    no directory or the system no ``fcntl``, the kernel compiles as numba's own does."""
    if fcntl is None:
        return dispatcher
    try:
        lock = Path(f"{dispatcher._cache._cache_file._index_path}.lock")
        from numba.core.compiler_lock import global_compiler_lock
    except (AttributeError, ImportError):   # another numba's internals
        return dispatcher
    compile_ = dispatcher.compile

    def compile(sig):
        with global_compiler_lock:
            fd = None if lock in _HELD else _lock(lock)
            if fd is None:
                return compile_(sig)
            _HELD.add(lock)
            try:
                return compile_(sig)
            finally:
                _HELD.discard(lock)
                fcntl.flock(fd, fcntl.LOCK_UN)   # a child forked meanwhile shares the descriptor: closing would not
                fd.close()

    dispatcher.compile = compile
    return dispatcher


def _lock(path: Path):
    """``path`` opened and locked exclusively (waiting for another process's lock); None where it cannot be made
    or locked (a cache directory it cannot write: numba then caches elsewhere or not at all)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = open(path, "a")
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:
        fd.close()
        return None
    return fd


def jit(fn: F) -> F:
    """``fn`` compiled in nopython mode without the GIL when numba is installed, else ``fn`` itself."""
    return one_compile_at_a_time(numba.njit(nogil=True, cache=True)(fn)) if numba is not None else fn


def _without_refcounts() -> dict:
    """numba's option to compile a function without reference counting (``_nrt=False``, not public), where
    this numba has it; none otherwise (the same results, slower)."""
    try:
        from numba.core.cpu import CPUTargetOptions
        return {"_nrt": False} if isinstance(getattr(CPUTargetOptions, "_nrt", None),
                                             CPUTargetOptions.Mapping) else {}
    except Exception:   # another numba's internals
        return {}


def jit_helper(fn: F) -> F:
    """``jit`` for a small helper that takes arrays and allocates none, compiled without numba's reference
    counting. Each call of an ordinary compiled function increments and decrements the count of every array
    it takes, with locked instructions, which also wait for the loop's outstanding cache misses: in a
    kernel's per-row loop over large arrays these calls cost more than the work."""
    return one_compile_at_a_time(numba.njit(nogil=True, cache=True, **_without_refcounts())(fn)) \
        if numba is not None else fn


def python(fn: Callable) -> Callable:
    """The plain-Python body of a kernel made by ``jit`` (itself when numba is absent)."""
    return getattr(fn, "py_func", fn)


__all__ = ["KERNEL", "jit", "jit_helper", "one_compile_at_a_time", "python"]
