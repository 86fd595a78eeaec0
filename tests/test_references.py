"""Every path and dotted name that README.md, protocol.md and tubeq's own docstrings and
comments point at exists: a file moved or a symbol renamed fails here, not in a reader's hands.

What counts as a reference: a repository path (``tubeq/...``, ``tests/...``, ``bench/...`` ending
in a source or document suffix), a path inside the package as the text writes it
(``store/base.py``, ``lua/includes/jobs.lua``: resolved from the repository, the package, the
store, its lua/ folder, bench/ or the citing file's folder), and a dotted name under ``tubeq``
(a module, then attributes). Names that only look dotted are listed in NOT_SYMBOLS.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_REPO_PATH = re.compile(
    r"(?<![\w/.-])((?:tubeq|tests|bench)/[\w/.-]*\w\.(?:py|lua|md|js|toml|json|txt))")
_PACKAGE_PATH = re.compile(
    r"(?<![\w/.-])((?:server|store|protocol|http|redisio|model|client|pipeline|lua|includes|"
    r"harness|probes|peers)/[\w/.-]*\w\.(?:py|lua))")
_DOTTED = re.compile(r"(?<![\w.])(tubeq(?:\.[A-Za-z_]\w*)+)")
_BASES = (ROOT, ROOT / "tubeq", ROOT / "tubeq" / "store", ROOT / "tubeq" / "store" / "lua",
          ROOT / "bench")
# Files and a logger that are named like symbols: the data directory's lock, a socket path in
# an example, and the slow-command log's logger name.
NOT_SYMBOLS = frozenset({"tubeq.lock", "tubeq.sock", "tubeq.slow",
                         # span attribute and tracer names (protocol.md, "Traces")
                         "tubeq.namespace", "tubeq.outcome", "tubeq.reserves", "tubeq.link",
                         "tubeq.tracing"})


def _sources() -> Iterator[Path]:
    yield ROOT / "README.md"
    yield ROOT / "protocol.md"
    if (ROOT / "bench" / "README.md").exists():
        yield ROOT / "bench" / "README.md"
    yield from sorted((ROOT / "tubeq").rglob("*.py"))
    yield from sorted((ROOT / "tubeq").rglob("*.lua"))


def _resolves(name: str) -> bool:
    """Whether ``name`` is an importable module of tubeq, or attributes of one."""
    parts = name.split(".")
    for split in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attribute in parts[split:]:
            if not hasattr(found, attribute):
                return False
            found = getattr(found, attribute)
        return True
    return False


def dangling() -> list[str]:
    """``file:line: reference`` for every reference that points at nothing."""
    out = []
    for source in _sources():
        text = source.read_text()
        where = source.relative_to(ROOT).as_posix()

        def line(at: int, text: str = text) -> int:
            return text.count("\n", 0, at) + 1

        for match in _REPO_PATH.finditer(text):
            if not (ROOT / match.group(1)).exists():
                out.append(f"{where}:{line(match.start())}: {match.group(1)}")
        for match in _PACKAGE_PATH.finditer(text):
            relative = match.group(1)
            if not any((base / relative).exists() for base in (*_BASES, source.parent)):
                out.append(f"{where}:{line(match.start())}: {relative}")
        for match in _DOTTED.finditer(text):
            name = match.group(1)
            if name not in NOT_SYMBOLS and not _resolves(name):
                out.append(f"{where}:{line(match.start())}: {name}")
    return out


def test_every_path_and_symbol_named_in_the_docs_exists() -> None:
    assert dangling() == []


def test_the_finder_reports_what_moved() -> None:
    """The finder itself: a symbol or module that moved, and a path that did, are found."""
    assert _resolves("tubeq.store.records.Reservation")
    assert not _resolves("tubeq.store.records.NoSuchRecord")
    assert not _resolves("tubeq.redisio.checks.claim_layout_version")  # moved to store.layout
    found = _REPO_PATH.search("measured by bench/lua_cost.py, now")
    assert found is not None and found.group(1) == "bench/lua_cost.py"
    assert not (ROOT / found.group(1)).exists()  # it is bench/probes/lua_cost.py
