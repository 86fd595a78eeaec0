"""Every benchmark module imports: `make bench` is not part of `make test`, so a renamed helper
(bench.ab once imported a function bench.run no longer had) would otherwise break it unseen.
The peers' drivers run in their own virtualenvs with the peers' libraries, and ``__main__``
modules run on import: both are left out."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import bench

MODULES = sorted(
    info.name for info in pkgutil.walk_packages(bench.__path__, "bench.")
    if not info.name.startswith("bench.peers.drivers") and not info.name.endswith("__main__"))


@pytest.mark.parametrize("name", MODULES)
def test_bench_module_imports(name: str) -> None:
    importlib.import_module(name)
