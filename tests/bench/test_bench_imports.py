"""Every benchmark module imports: `make bench` is not part of `make test`, so a renamed helper
(bench.ab once imported a function bench.run no longer had) would otherwise break it unseen.
The peers' drivers run in their own virtualenvs with the peers' libraries, and ``__main__``
modules run on import: both are left out.

The harness (bench/harness/) is what every scenario and probe stands on: it imports nothing of
bench/ outside itself, so no scenario's change can reach into it. Every import counts, also
those inside functions and under TYPE_CHECKING."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

import bench
import bench.harness

MODULES = sorted(
    info.name for info in pkgutil.walk_packages(bench.__path__, "bench.")
    if not info.name.startswith("bench.peers.drivers") and not info.name.endswith("__main__"))
HARNESS_DIR = Path(bench.harness.__file__).parent


@pytest.mark.parametrize("name", MODULES)
def test_bench_module_imports(name: str) -> None:
    importlib.import_module(name)


def _bench_imports(path: Path) -> set[str]:
    """The bench.* names ``path`` imports, anywhere in the file: each module, and each name taken
    from one (``from bench import run`` names bench.run); relative imports are resolved against
    bench.harness."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(["bench", "harness"][:3 - node.level] + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {name for name in found if name.startswith("bench.")}


@pytest.mark.parametrize("path", sorted(HARNESS_DIR.glob("*.py")), ids=lambda p: p.name)
def test_harness_imports_nothing_of_bench_outside_it(path: Path) -> None:
    outside = {name for name in _bench_imports(path)
               if name != "bench.harness" and not name.startswith("bench.harness.")}
    assert not outside, f"{path.name} imports {sorted(outside)}"
