"""The package's import graph: no circles, and no module importing from a layer above its own.

Every import of a ``hotcold`` module counts, at the top of a file or inside a
function (a lazy import is still a dependency), and so does one under
``if TYPE_CHECKING:`` (a type named from a layer above is a dependency on it
too). A new module must be placed in a layer (``LAYERS``). The longest chain of
imports a process can run through is held to ``MAX_CHAIN`` modules.
"""
from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

#: bottom to top: a module imports from its own layer and those below. Entries name a module or a package
#: (``data``: every module under it) relative to ``hotcold`` (``""``: the package itself, its version); a name
#: ending in ``*`` is a prefix of module names
LAYERS = (
    ("foundation", ("", "accel", "config", "counters", "devices", "files", "jit", "machine", "metrics", "sorting")),
    ("options and budgets", ("options",)),
    ("measured models, data and policies", ("contention", "timing", "costmodel", "data", "trace", "model", "model_size",
                                            "policies")),
    ("stores", ("embedding", "distributed", "pipeline", "memory", "dense_step")),
    ("registry", ("methods", "run_config")),
    ("training and its measurement", ("train", "record_status", "workflow", "calibrate", "bench")),
    ("runs and reports", ("analysis", "runs")),
    ("checks", ("gpucheck",)),
    ("entry points", ("cli", "__main__")),
)


def modules() -> dict[str, Path]:
    out = {}
    for path in (SRC / "hotcold").rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


@functools.cache
def parsed(path: Path) -> ast.Module:
    """A module's syntax tree, parsed once for this file's tests (read-only: the tests only walk it)."""
    return ast.parse(path.read_text())


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for n in ast.walk(node))
    return skip


@functools.cache
def imports(types: bool = False) -> dict[str, set[str]]:
    """module -> the hotcold modules it imports (a name from a package resolved to its module, if it is one);
    ``types``: those under ``if TYPE_CHECKING:`` too."""
    mods = modules()

    def resolve(name: str) -> str | None:
        parts = name.split(".")
        while parts and ".".join(parts) not in mods:
            parts.pop()
        return ".".join(parts) or None

    edges: dict[str, set[str]] = {}
    for mod, path in mods.items():
        tree = parsed(path)
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        skip = set() if types else _type_checking_nodes(tree)
        found = set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                names = [f"{base}.{a.name}" for a in node.names]  # a module of the package, else a name in it
            else:
                continue
            for name in names:
                if name.split(".")[0] == "hotcold":
                    target = resolve(name)
                    if target and target != mod:
                        found.add(target)
        edges[mod] = found
    return edges


def layer_of(module: str) -> int:
    """The layer of ``hotcold.<module>``: its longest matching entry's."""
    name = module.removeprefix("hotcold").lstrip(".")
    best, best_len = None, -1
    for i, (_, entries) in enumerate(LAYERS):
        for entry in entries:
            hit = (name.startswith(entry[:-1]) if entry.endswith("*")
                   else name == entry or bool(entry) and name.startswith(entry + "."))
            if hit and len(entry) > best_len:
                best, best_len = i, len(entry)
    if best is None:
        raise AssertionError(f"{module} is in no layer: place it in tests/test_layers.py's LAYERS")
    return best


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(edges.get(nxt, ())))))
                elif nxt in on:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_the_checks_find_a_circle_and_an_upward_import():
    """The negative control: a made-up graph with both faults."""
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert layer_of("hotcold.config") < layer_of("hotcold.train") < layer_of("hotcold.cli.main")
    assert layer_of("hotcold.runs.records") == layer_of("hotcold.runs")
    assert circles({"a": {"b"}, "b": {"a"}}) == [["a", "b"]]


def longest_chain(edges: dict[str, set[str]]) -> list[str]:
    """The longest path of imports in an acyclic graph, as its modules."""
    @functools.cache
    def chain(module: str) -> tuple[str, ...]:
        return (module, *max((chain(t) for t in sorted(edges.get(module, ()))), key=len, default=()))

    return list(max((chain(m) for m in sorted(edges)), key=len, default=()))


#: the most modules one chain of runtime imports may pass through (``__main__`` -> ``cli`` -> ... -> ``config``)
MAX_CHAIN = 12


def test_the_chain_measure_finds_the_longest_path():
    assert longest_chain({"a": {"b", "d"}, "b": {"c"}, "c": set(), "d": set()}) == ["a", "b", "c"]


def test_no_module_imports_itself_back_not_even_for_a_type():
    assert circles(imports(types=True)) == []


def test_no_module_imports_from_a_layer_above_its_own_not_even_for_a_type():
    upward = [f"{m} ({LAYERS[layer_of(m)][0]}) -> {t} ({LAYERS[layer_of(t)][0]})"
              for m, targets in sorted(imports(types=True).items()) for t in sorted(targets)
              if layer_of(t) > layer_of(m)]
    assert upward == []


def test_the_longest_runtime_import_chain_is_short():
    chain = longest_chain(imports())
    assert len(chain) <= MAX_CHAIN, " -> ".join(chain)


def test_nothing_but_the_registry_imports_by_name():
    """``import_module`` and a lazy module ``__getattr__`` hide an import from this graph: the method registry
    (``methods``) alone names its stores and pricing functions so, to read the registry without torch."""
    found = []
    for mod, path in sorted(modules().items()):
        tree = parsed(path)
        lazy = any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in tree.body)
        if mod != "hotcold.methods" and ("import_module" in path.read_text() or lazy):
            found.append(mod)
    assert found == []


#: the modules behind the verbs that read records, draw, or replay the training order (every rule but training
#: and ``calibrate``)
NO_TORCH = ("hotcold.distributed.shardsim", "hotcold.analysis.tables", "hotcold.analysis.scaleout", "hotcold.analysis.figures",
            "hotcold.analysis.modelled", "hotcold.analysis.claims.report", "hotcold.analysis.hit_rate_curves", "hotcold.analysis.comparisons",
            "hotcold.trace.sweeps", "hotcold.trace.curves", "hotcold.trace.profile", "hotcold.distributed.sweep",
            "hotcold.data.generators", "hotcold.cli")


def test_the_jobs_that_only_read_or_replay_start_without_torch():
    """Importing torch costs a process 1.5-2 s here; a job that does not train does not pay it."""
    code = (f"import importlib, sys\nfor m in {NO_TORCH!r}: importlib.import_module(m)\n"
            "print(sorted(k for k in sys.modules if k == 'torch' or k.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(SRC)}).stdout
    assert out.strip() == "[]"


def test_reading_every_methods_options_imports_neither_torch_nor_numba():
    """Snakemake's dry run checks every configured store's options (plans included): numba's import alone cost
    each one 0.5 s."""
    code = ("import sys\nfrom hotcold import methods\n"
            "for name in methods.names():\n    methods.get(name).parse_options({})\n"
            "for plan in ('row', 'column', 'recshard', 'flexshard', 'twrw'):\n"
            "    methods.get('sharded').parse_options({'plan': plan})\n"
            "print(sorted(k for k in ('torch', 'numba') if k in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(SRC)}).stdout
    assert out.strip() == "[]"
