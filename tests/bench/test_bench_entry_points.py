"""Every benchmark command answers ``--help`` without measuring anything, and bench/README.md
names each of them and each ``make bench*`` target: the README is the map a newcomer reads
first, so a command it does not name is one nobody will find, and a name it keeps for a removed
command points nowhere.

An entry point is a bench module run as ``python -m``: one with a ``__main__`` block, or a
package's ``__main__.py`` (bench.peers). The peers' driver and the hop measure's echo peer are
left out: the orchestrator runs the one inside each peer's own virtualenv, bench.harness.hops the
other as its peer process, never a person."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import re
import sys
from pathlib import Path

import pytest

import bench

BENCH_DIR = Path(next(iter(bench.__path__)))  # a namespace package: no __file__
README = BENCH_DIR / "README.md"
MAKEFILE = BENCH_DIR.parent / "Makefile"
INTERNAL = {"bench.peers.driver", "bench.harness.hops"}


def _entry_points() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(bench.__path__, "bench."):
        if info.name.startswith("bench.peers.drivers") or info.name in INTERNAL:
            continue
        if info.name.endswith(".__main__"):
            names.append(info.name.removesuffix(".__main__"))
            continue
        spec = importlib.util.find_spec(info.name)
        if spec and spec.origin and 'if __name__ == "__main__":' in Path(spec.origin).read_text():
            names.append(info.name)
    return sorted(names)


ENTRY_POINTS = _entry_points()


def _main_of(name: str) -> object:
    module = importlib.import_module(f"{name}.run" if name == "bench.peers" else name)
    return module.main


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_entry_point_answers_help(name: str, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "argv", [name, "--help"])
    main = _main_of(name)
    with pytest.raises(SystemExit) as stopped:
        main()  # type: ignore[operator]
    assert stopped.value.code == 0
    assert "usage:" in capsys.readouterr().out


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_readme_names_entry_point(name: str) -> None:
    assert re.search(rf"\b{re.escape(name)}\b", README.read_text()), \
        f"bench/README.md does not name {name}"


def test_readme_names_every_make_target() -> None:
    targets = re.findall(r"^(bench[\w-]*):", MAKEFILE.read_text(), re.MULTILINE)
    assert "bench-ab" in targets
    text = README.read_text()
    missing = [t for t in targets if not re.search(rf"make {re.escape(t)}\b", text)]
    assert not missing, f"bench/README.md does not name make {missing}"
