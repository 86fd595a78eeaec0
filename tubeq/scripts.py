"""The Lua scripts: read from package data, includes expanded, called by SHA.

A script file starts with a header (KEYS, ARGV, Returns, Events) and may pull shared pieces with
``--- @include "name"`` lines (files under ``lua/includes/``); each include is expanded once per
script. Every script receives exactly one key, the namespace root (see :mod:`tubeq.keys`).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources

_INCLUDE = re.compile(r'^--- @include "([a-z_]+)"$', re.MULTILINE)


@dataclass(frozen=True, slots=True)
class Script:
    name: str
    source: bytes
    sha: str


def _expand(text: str, seen: set[str]) -> str:
    def include(match: re.Match[str]) -> str:
        name = match.group(1)
        if name in seen:
            return ""
        seen.add(name)
        body = resources.files("tubeq").joinpath("lua", "includes", f"{name}.lua").read_text()
        return _expand(body, seen)

    return _INCLUDE.sub(include, text)


def load_script(name: str) -> Script:
    """Read ``lua/<name>.lua`` with its includes expanded."""
    text = resources.files("tubeq").joinpath("lua", f"{name}.lua").read_text()
    source = _expand(text, set()).encode()
    return Script(name, source, hashlib.sha1(source).hexdigest())


def script_names() -> list[str]:
    """Every script shipped in the package, by name."""
    folder = resources.files("tubeq").joinpath("lua")
    return sorted(p.name[:-4] for p in folder.iterdir() if p.name.endswith(".lua"))


def load_all() -> dict[str, Script]:
    return {name: load_script(name) for name in script_names()}
