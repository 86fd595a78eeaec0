"""The Lua scripts: read from package data, includes expanded, called by SHA.

A script file starts with a header (KEYS, ARGV, Returns, Events) and may pull shared pieces with
``--- @include "name"`` lines (files under ``lua/includes/``); each include is expanded once per
script. Every script receives exactly one key, the namespace root (see :mod:`tubeq.store.keys`).
A script that includes ``events`` (it writes lifecycle events, ``lua/includes/events.lua``)
also receives two bound arguments first, fixed per process: ARGV[1] the event stream's cap (0:
events off) and ARGV[2] the calling process's instance id; its own arguments follow.

Only the definitions a script uses are kept, with the ones they use in turn: Redis runs a
script's whole text on every call, and each ``local function`` or key name it defines costs
time per call (the shared includes define ~30: ~2 us of put.lua's ~11 us before this pruning).
An include is a sequence of top-level ``local`` definitions, each with the comment above it.
A definition that is a string and nothing else (``local JOB_TUBE = 't'``: the job record's
field names, ``lua/includes/job_record.lua``) is written in where a script uses it instead: as
a local, every function of the script that reads it would capture it on every call (measured
~2-3 us of Redis time per put+reserve+delete cycle by EVALSHA, bench/probes/lua_cost.py).

Where Redis has Functions (7.0+), every script is also one function of a single library,
:func:`library`, loaded once (``FUNCTION LOAD``) and called by name (``FCALL``): the included
definitions are then made once per load instead of once per call, which measured ~5-8 us of
Redis time per hot-path call (bench/probes/lua_cost.py). The script texts stay the same, so the
library and the per-script sources (the fallback, ``EVALSHA``) run the same code, string
constants written in alike. A library function
has no ``KEYS``/``ARGV`` globals and cannot read ``redis.call`` at load time, so the library
declares them, and every definition whose value depends on them (the namespace's key names, the
bound event arguments, ``rcall``), as locals that each call assigns before the script's body: the
key names only when the namespace root differs from the previous call's.
A script whose every Redis call is a literal read command is flagged ``no-writes`` (it then runs
on a Redis out of memory, as the same script run by EVALSHA does).

The assembly runs once per change of the sources, not at every start: its result is kept in the
user's cache directory under a hash of the .lua files and this module (:func:`sources_hash`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

_INCLUDE = re.compile(r'^--- @include "([a-z_]+)"$', re.MULTILINE)
_DEFINES = re.compile(r"^local (?:function (\w+)|([\w, ]+?) =)")
_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
# Comments and string literals, dropped before looking for the names a piece of Lua uses.
_NOT_CODE = re.compile(r"--\[\[.*?\]\]|--[^\n]*|'(?:\\.|[^'\\])*'|\"(?:\\.|[^\"\\])*\"",
                       re.DOTALL)
# A definition whose value is one string literal (a comment may follow it on its line).
_STRING_CONSTANT = re.compile(r"^local (\w+) = ('[^'\\\n]*')[ \t]*(?:--[^\n]*)?\s*\Z", re.MULTILINE)
# What a script's code is made of for writing constants in: comments and strings, kept as they
# are, and names (one after a '.' or ':' is a table's field, never a constant).
_NAME_OR_NOT_CODE = re.compile(_NOT_CODE.pattern + r"|(?<![.:\w])[A-Za-z_]\w*", re.DOTALL)


# The includes in the order the library defines them: each after the ones it uses.
INCLUDE_ORDER = ("text", "job_record", "keys", "ends", "events", "limits", "groups", "jobs", "refs",
                 "waiter_counts", "picking", "handing", "policies", "after")

# Commands that only read: a script calling nothing else is a read-only function.
_READ_COMMANDS = frozenset({
    "EXISTS", "GET", "HEXISTS", "HGET", "HGETALL", "HKEYS", "HLEN", "HMGET", "HVALS", "LLEN",
    "LRANGE", "MGET", "SCARD", "SISMEMBER", "SMEMBERS", "SRANDMEMBER", "TIME", "TYPE", "XLEN",
    "XRANGE", "ZCARD", "ZCOUNT", "ZRANGE", "ZRANGEBYSCORE", "ZRANK", "ZREVRANGE", "ZSCORE",
    "ZMSCORE"})
_CALL_SITE = re.compile(r"\b(?:rcall|redis\.call|redis\.pcall)\(\s*(?:'(\w+)'|\"(\w+)\")?")


@dataclass(frozen=True, slots=True)
class Script:
    name: str
    source: bytes
    sha: str
    records_events: bool  # takes the two bound event arguments first (see the module header)
    read_only: bool  # calls only read commands (a ``no-writes`` function in the library)


@dataclass(frozen=True, slots=True)
class Library:
    """Every script as a function of one Redis Functions library (see the module header)."""
    name: str  # "tubeq_<hash>": tubeq versions sharing a Redis load libraries of their own
    source: bytes
    functions: dict[str, str]  # script name -> function name


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


@functools.cache
def _include_text(name: str) -> str:
    return resources.files("tubeq.store").joinpath("lua", "includes", f"{name}.lua").read_text()


@functools.cache
def _include_parsed(name: str) -> tuple[_Definition, ...]:
    """An include's definitions, parsed once per process for every script that includes it."""
    return tuple(_definitions(_include_text(name)))


def _include_definitions(text: str, seen: set[str]) -> list[_Definition]:
    """The definitions of every include ``text`` names, recursively, each include once."""
    found: list[_Definition] = []
    for name in _INCLUDE.findall(text):
        if name in seen:
            continue
        seen.add(name)
        found += _include_definitions(_include_text(name), seen)
        found += _include_parsed(name)
    return found


def _needed(code: str, by_name: dict[str, _Definition]) -> set[str]:
    """The names of the definitions ``code`` uses, with the ones those use in turn."""
    needed: set[str] = set()
    todo = list(_uses(code))
    while todo:
        name = todo.pop()
        d = by_name.get(name)
        if d is not None and name not in needed:
            needed |= d.names
            todo += d.uses
    return needed


def _split(text: str) -> tuple[str, str]:
    """A script's text before its first include line (the header), and its body after the
    include lines."""
    first = _INCLUDE.search(text)
    if first is None:
        return "", text
    return text[:first.start()], _INCLUDE.sub("", text[first.end():]).lstrip("\n")


def _write_in(constants: dict[str, str], code: str) -> str:
    """``code`` with each use of a name of ``constants`` replaced by its value."""
    if not constants:
        return code
    return _NAME_OR_NOT_CODE.sub(lambda m: constants.get(m[0], m[0]), code)


def expand(text: str) -> str:
    """``text`` with its includes replaced by the definitions it uses (transitively), in the
    order the includes define them, where its first include line was; the string constants
    among them written in where they are used (see the module header)."""
    definitions = _include_definitions(text, set())
    needed = _needed(_INCLUDE.sub("", text), {n: d for d in definitions for n in d.names})
    if _INCLUDE.search(text) is None:
        return text
    constants: dict[str, str] = {}
    kept = []
    for d in definitions:
        if d.names & needed:
            found = _STRING_CONSTANT.search(d.text)
            if found is None:
                kept.append(d.text)
            else:
                constants[found[1]] = found[2]
    header, body = _split(text)
    return header + _write_in(constants, "".join(kept) + body)


def calls_only_reads(source: str) -> bool:
    """Whether every Redis call in ``source`` names a read command literally."""
    commands = [m[1] or m[2] for m in _CALL_SITE.finditer(_NOT_CODE.sub(
        lambda m: m[0] if m[0][0] in "'\"" else " ", source))]
    return all(c is not None and c.upper() in _READ_COMMANDS for c in commands)


def _script_text(name: str) -> str:
    return resources.files("tubeq.store").joinpath("lua", f"{name}.lua").read_text()


def load_script(name: str) -> Script:
    """Read ``lua/<name>.lua`` with the included definitions it uses."""
    text = _script_text(name)
    expanded = expand(text)
    source = expanded.encode()
    records_events = "events" in _INCLUDE.findall(text)
    return Script(name, source, hashlib.sha1(source).hexdigest(), records_events,
                  calls_only_reads(expanded))


def script_names() -> list[str]:
    """Every script shipped in the package, by name."""
    folder = resources.files("tubeq.store").joinpath("lua")
    return sorted(p.name[:-4] for p in folder.iterdir() if p.name.endswith(".lua"))


def load_all() -> dict[str, Script]:
    """Every script (built once per process, or read from the build cache; do not mutate)."""
    return _built()[0]


# -- the library (Redis Functions) ----------------------------------------------------------

_ASSIGNMENT = re.compile(r"^local ([\w, ]+?) = (.*)$", re.DOTALL)
# What a definition's value may depend on that changes from call to call.
_PER_ROOT = frozenset({"KEYS"})
_PER_CALL = frozenset({"ARGV", "redis"})


@dataclass(frozen=True, slots=True)
class _Binding:
    """A top-level variable the library assigns on a call instead of defining at load."""
    names: frozenset[str]
    comment: str  # the comment lines above the definition, kept where it is declared
    assignment: str  # "A, B = <expression>"
    per_root: bool  # depends on the namespace root (else on the call's arguments)


def _binding(d: _Definition, bound: dict[str, _Binding]) -> _Binding | None:
    """How ``d`` is bound in the library: None for a function, or a value fixed at load."""
    lines = d.text.splitlines(keepends=True)
    code_at = next(i for i, line in enumerate(lines) if line.startswith("local "))
    found = _ASSIGNMENT.match("".join(lines[code_at:]))
    if found is None or found[2].startswith("function"):
        return None
    per_root = bool(d.uses & _PER_ROOT) or any(bound[n].per_root for n in d.uses & bound.keys())
    per_call = bool(d.uses & _PER_CALL) or any(n in bound for n in d.uses)
    if not (per_root or per_call):
        return None
    return _Binding(d.names, "".join(lines[:code_at]), f"{found[1]} = {found[2].rstrip()}\n",
                    per_root)


def _include_names() -> set[str]:
    folder = resources.files("tubeq.store").joinpath("lua", "includes")
    return {p.name[:-4] for p in folder.iterdir() if p.name.endswith(".lua")}


def _library_code(function_of: dict[str, str], scripts: dict[str, Script]) -> str:
    """The library's code (without its name line), each script registered as ``function_of``
    names it."""
    if set(INCLUDE_ORDER) != _include_names():  # a new include must be placed in the order
        raise RuntimeError(f"INCLUDE_ORDER {INCLUDE_ORDER} does not list every file of "
                           f"lua/includes/: {sorted(_include_names())}")
    definitions = [d for name in INCLUDE_ORDER for d in _include_parsed(name)]
    by_name = {n: d for d in definitions for n in d.names}
    bound: dict[str, _Binding] = {}
    # The string constants are written in here too, as in each script (expand): a Lua function
    # holds at most 200 locals, and the library's main chunk declares every other definition.
    constants: dict[str, str] = {}
    parts = ["local KEYS, ARGV\n"]
    for d in definitions:
        constant = _STRING_CONSTANT.search(d.text)
        if constant is not None:
            constants[constant[1]] = constant[2]
            continue
        binding = _binding(d, bound)
        if binding is None:
            parts.append(d.text)
            continue
        for n in binding.names:
            bound[n] = binding
        parts.append(f"{binding.comment}local {', '.join(sorted(binding.names))}\n")
    per_root = list(dict.fromkeys(b for b in bound.values() if b.per_root))
    per_call = list(dict.fromkeys(b for b in bound.values() if not b.per_root))
    parts.append("-- The key names, assigned again when a call's root is not the last call's.\n"
                 "local bound_root\nlocal function bind_root()\n"
                 "  if KEYS[1] == bound_root then return end\n  bound_root = KEYS[1]\n"
                 + "".join(f"  {b.assignment}" for b in per_root) + "end\n")
    for script, function in function_of.items():
        text = _script_text(script)
        header, body = _split(text)
        needed = _needed(body, by_name)
        assign = "".join(f"  {b.assignment}" for b in per_call if b.names & needed)
        flags = ", flags = {'no-writes'}" if scripts[script].read_only else ""
        parts.append(f"{header}redis.register_function{{function_name = '{function}', "
                     f"callback = function(keys, args)\n  KEYS, ARGV = keys, args\n"
                     f"  bind_root()\n{assign}{body.rstrip()}\nend{flags}}}\n")
    return _write_in(constants, "".join(parts))


def library() -> Library:
    """Every script as a function of one library, named after a hash of its code."""
    return _built()[1]


# Stands for the library's version in its function names until the version is known: the
# version is a hash of the code with this in its place.
_VERSION_SLOT = "@@version@@"


def _build_library(scripts: dict[str, Script]) -> Library:
    names = sorted(scripts)
    draft = _library_code({n: f"tq{_VERSION_SLOT}_{n}" for n in names}, scripts)
    version = hashlib.sha1(draft.encode()).hexdigest()[:12]
    functions = {n: f"tq{version}_{n}" for n in names}
    source = f"#!lua name=tubeq_{version}\n{draft.replace(_VERSION_SLOT, version)}".encode()
    return Library(f"tubeq_{version}", source, functions)


# -- built once: the cache ------------------------------------------------------------------
#
# Assembling the scripts and the library takes ~0.3-1 s of CPU (a regex pass per definition
# per script), which every start paid. The result depends only on the .lua files and on this
# module's code, so it is kept in a file named after a hash of exactly those, in the user's
# cache directory ($XDG_CACHE_HOME/tubeq, else ~/.cache/tubeq): built by the first start after
# any of them changed (or the first use in a fresh install), read by every later one. A cache
# that cannot be read or written (no home, a read-only one) only costs the build each start.

def cache_dir() -> Path | None:
    """Where the built scripts are kept, or None where there is no such place."""
    base = os.environ.get("XDG_CACHE_HOME")
    if not base:
        home = os.environ.get("HOME")
        if not home:
            return None
        base = os.path.join(home, ".cache")
    return Path(base) / "tubeq"


def sources_hash() -> str:
    """A hash of everything the built scripts depend on: every .lua file and this module."""
    digest = hashlib.sha256(Path(__file__).read_bytes())
    lua = resources.files("tubeq.store").joinpath("lua")
    for folder in (lua, lua.joinpath("includes")):
        for entry in sorted(folder.iterdir(), key=lambda e: e.name):
            if entry.name.endswith(".lua"):
                digest.update(f"\0{folder.name}/{entry.name}\0".encode())
                digest.update(entry.read_bytes())
    return digest.hexdigest()[:32]


@functools.cache
def _built() -> tuple[dict[str, Script], Library]:
    """The scripts and the library: from the cache when it has this build, else built (and
    kept there)."""
    folder = cache_dir()
    try:
        path = folder / f"lua-{sources_hash()}.json" if folder is not None else None
    except OSError:  # this module's own file unreadable (a zip install): no cache
        path = None
    if path is not None:
        try:
            return _decode(json.loads(path.read_bytes()))
        except (OSError, ValueError, KeyError, TypeError):
            pass  # not there yet, or unreadable: built again below
    scripts = {name: load_script(name) for name in script_names()}
    built = scripts, _build_library(scripts)
    if path is not None:
        _keep(path, built)
    return built


def _keep(path: Path, built: tuple[dict[str, Script], Library]) -> None:
    """Write the build to ``path`` whole or not at all (other processes may read it now)."""
    scripts, lib = built
    data = {"scripts": {name: [s.source.decode(), s.records_events, s.read_only]
                        for name, s in scripts.items()},
            "library": [lib.name, lib.source.decode(), lib.functions]}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=path.parent, prefix=".lua-", suffix=".tmp")
    except OSError:
        return
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(data, out)
        os.replace(temp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temp)


def _decode(data: dict[str, Any]) -> tuple[dict[str, Script], Library]:
    scripts = {}
    for name, (text, records_events, read_only) in data["scripts"].items():
        source = text.encode()
        scripts[name] = Script(name, source, hashlib.sha1(source).hexdigest(),
                               bool(records_events), bool(read_only))
    name, source, functions = data["library"]
    return scripts, Library(name, source.encode(), dict(functions))
