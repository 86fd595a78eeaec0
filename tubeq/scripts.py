"""The Lua scripts: read from package data, includes expanded, called by SHA.

A script file starts with a header (KEYS, ARGV, Returns, Events) and may pull shared pieces with
``--- @include "name"`` lines (files under ``lua/includes/``); each include is expanded once per
script. Every script receives exactly one key, the namespace root (see :mod:`tubeq.keys`).
A script that includes ``events`` (it writes lifecycle events, ``lua/includes/events.lua``)
also receives two bound arguments first, fixed per process: ARGV[1] the event stream's cap (0:
events off) and ARGV[2] the calling process's instance id; its own arguments follow.

Only the definitions a script uses are kept, with the ones they use in turn: Redis runs a
script's whole text on every call, and each ``local function`` or key name it defines costs
time per call (the shared includes define ~30: ~2 us of put.lua's ~11 us before this pruning).
An include is a sequence of top-level ``local`` definitions, each with the comment above it.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources

_INCLUDE = re.compile(r'^--- @include "([a-z_]+)"$', re.MULTILINE)
_DEFINES = re.compile(r"^local (?:function (\w+)|([\w, ]+?) =)")
_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
# Comments and string literals, dropped before looking for the names a piece of Lua uses.
_NOT_CODE = re.compile(r"--\[\[.*?\]\]|--[^\n]*|'(?:\\.|[^'\\])*'|\"(?:\\.|[^\"\\])*\"",
                       re.DOTALL)


@dataclass(frozen=True, slots=True)
class Script:
    name: str
    source: bytes
    sha: str
    records_events: bool  # takes the two bound event arguments first (see the module header)


@dataclass(frozen=True, slots=True)
class _Definition:
    text: str  # the definition with the comment above it
    names: frozenset[str]  # what it defines
    uses: frozenset[str]  # the identifiers its code mentions


def _uses(code: str) -> frozenset[str]:
    return frozenset(_IDENTIFIER.findall(_NOT_CODE.sub(" ", code)))


def _definitions(text: str) -> list[_Definition]:
    """Split an include into its top-level definitions (comment lines above one belong to it)."""
    pieces: list[tuple[list[str], frozenset[str]]] = []
    pending: list[str] = []  # comment and blank lines waiting for the next definition
    for line in text.splitlines(keepends=True):
        found = _DEFINES.match(line)
        if found is not None:
            names = found[1] or found[2]
            pieces.append(([*pending, line], frozenset(n.strip() for n in names.split(","))))
            pending = []
        elif pieces and (line.startswith((" ", "end")) or not line.strip()) and not pending:
            pieces[-1][0].append(line)  # the body of the definition above
        elif line.strip():
            pending.append(line)
        else:
            pending = [] if not pieces else pending  # a blank line ends a file header
    return [_Definition("".join(lines), names, _uses("".join(lines))) for lines, names in pieces]


def _include_definitions(text: str, seen: set[str]) -> list[_Definition]:
    """The definitions of every include ``text`` names, recursively, each include once."""
    found: list[_Definition] = []
    for name in _INCLUDE.findall(text):
        if name in seen:
            continue
        seen.add(name)
        body = resources.files("tubeq").joinpath("lua", "includes", f"{name}.lua").read_text()
        found += _include_definitions(body, seen)
        found += _definitions(body)
    return found


def expand(text: str) -> str:
    """``text`` with its includes replaced by the definitions it uses (transitively), in the
    order the includes define them, where its first include line was."""
    definitions = _include_definitions(text, set())
    by_name = {name: d for d in definitions for name in d.names}
    needed: set[str] = set()
    todo = list(_uses(_INCLUDE.sub("", text)))
    while todo:
        name = todo.pop()
        d = by_name.get(name)
        if d is not None and name not in needed:
            needed |= d.names
            todo += d.uses
    kept = "".join(d.text for d in definitions if d.names & needed)
    first = _INCLUDE.search(text)
    if first is None:
        return text
    return text[:first.start()] + kept + _INCLUDE.sub("", text[first.end():]).lstrip("\n")


def load_script(name: str) -> Script:
    """Read ``lua/<name>.lua`` with the included definitions it uses."""
    text = resources.files("tubeq").joinpath("lua", f"{name}.lua").read_text()
    source = expand(text).encode()
    records_events = "events" in _INCLUDE.findall(text)
    return Script(name, source, hashlib.sha1(source).hexdigest(), records_events)


def script_names() -> list[str]:
    """Every script shipped in the package, by name."""
    folder = resources.files("tubeq").joinpath("lua")
    return sorted(p.name[:-4] for p in folder.iterdir() if p.name.endswith(".lua"))


def load_all() -> dict[str, Script]:
    return {name: load_script(name) for name in script_names()}
