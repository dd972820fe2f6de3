"""Compiled kernels: processes that start the same uncompiled kernel at once compile it once."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hotcold.jit import KERNEL

pytestmark = pytest.mark.skipif(KERNEL != "numba", reason="numba is not installed: kernels run as Python")

MODULE = '''
from hotcold.jit import jit


@jit
def square(x):
    return x * x


@jit
def kernel(n):
    s = 0
    for i in range(n):
        s += square(i) % 7
    return s
'''

# each process imports the module, says it is ready, waits for the other, then calls the kernel: both reach the
# compile together; prints its cache misses and hits
RACE = '''
import sys, time
from pathlib import Path
where, me = Path(sys.argv[1]), sys.argv[2]
sys.path.insert(0, str(where))
import racer
(where / f"ready-{me}").touch()
deadline = time.monotonic() + 60
while len(list(where.glob("ready-*"))) < 2 and time.monotonic() < deadline:
    time.sleep(0.001)
assert racer.kernel(10) == sum(i * i % 7 for i in range(10))
stats = [racer.kernel.stats, racer.square.stats]
print(sum(sum(s.cache_misses.values()) for s in stats), sum(sum(s.cache_hits.values()) for s in stats))
'''


@pytest.mark.skipif(sys.platform == "win32", reason="the compile lock needs fcntl")
def test_two_processes_starting_a_new_kernel_compile_it_once(tmp_path: Path) -> None:
    (tmp_path / "racer.py").write_text(MODULE)
    procs = [subprocess.Popen([sys.executable, "-c", RACE, str(tmp_path), str(i)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
    counts = sorted(tuple(map(int, out.split())) for out, _ in outs)
    # one process compiled both kernels (square inside kernel); the other waited, then loaded kernel's cache
    # (square is in it). Without the lock both compiled both: [(2, 0), (2, 0)].
    assert counts == [(0, 1), (2, 0)], outs
