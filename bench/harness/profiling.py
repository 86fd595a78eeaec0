"""Where tubeq's CPU goes: py-spy samples of the tubeq process, Redis's own per-command time.

Owns: attaching py-spy (``pip install '.[bench]'``) to a running process by PID (tubeq, or a
consume() worker) for a bounded duration, and turning its collapsed stacks and Redis's INFO
commandstats into small summaries (top functions by own time and by time including callees, time
per source area, Redis microseconds per job by command).

Rules:
* py-spy runs ``--nonblocking`` (it never pauses tubeq) at a modest rate, and only samples
  where a Python thread is running count: idle waits in the event loop are not CPU.
* A missing py-spy, or one that cannot attach, yields a summary that says so instead of failing
  the whole benchmark.
* py-spy is this harness's child: stopped by its PID (``Recording.stop``) on every path.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.harness.paths import REPO_ROOT
from bench.harness.servers import stop_process

SAMPLE_RATE_HZ = 250
# How a report names the sampling, next to its tables.
SAMPLING = f"py-spy at {SAMPLE_RATE_HZ} Hz, non-blocking, busy samples only"
TOP_FUNCTIONS = 12

# Source areas, first match wins, to say "what kind of work" a sampled frame is.
# A sample whose innermost Python frame is the loop runner is time spent inside uvloop's C code
# (epoll, socket reads, dispatching callbacks): py-spy sees no Python frame below it.
EVENT_LOOP_FRAMES = {("Runner.run", "asyncio/runners.py"), ("run", "uvloop/__init__.py")}
EVENT_LOOP_LABEL = "[uvloop event loop, C: epoll, socket reads, callback dispatch]"

AREAS = (
    ("tubeq/client/", "tubeq client (worker side)"),
    ("tubeq/server/connection.py", "tubeq connection adapter"),
    ("tubeq/server/reserves.py", "tubeq connection adapter"),
    ("tubeq/server/runs.py", "tubeq connection adapter"),
    ("tubeq/server/flow.py", "tubeq connection adapter"),
    ("tubeq/server/reserve_wait.py", "tubeq connection adapter"),
    ("tubeq/server/push.py", "tubeq connection adapter"),
    ("tubeq/server/handlers.py", "tubeq command handlers"),
    ("tubeq/protocol/parser.py", "tubeq protocol parser"),
    ("tubeq/store/store.py", "tubeq store (script calls, futures)"),
    ("tubeq/redisio/client.py", "tubeq Redis client"),
    ("tubeq/", "tubeq other"),
    ("asyncio/", "asyncio Python code (tasks, wait_for)"),
    ("uvloop/", "uvloop"),
    ("structlog/", "structlog"),
)


def py_spy_binary() -> str | None:
    """py-spy next to this interpreter (the venv) or on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


@dataclass
class Recording:
    """A py-spy process recording one PID into ``output`` (collapsed stacks)."""

    proc: subprocess.Popen[bytes] | None
    output: Path
    problem: str | None = None

    @classmethod
    def start(cls, pid: int, seconds: float, output: Path) -> Recording:
        binary = py_spy_binary()
        if binary is None:
            return cls(None, output, "py-spy is not installed (pip install '.[bench]')")
        command = [binary, "record", "--pid", str(pid), "--rate", str(SAMPLE_RATE_HZ),
                   "--duration", str(max(1, round(seconds))), "--format", "raw", "--function",
                   "--nonblocking", "--output", str(output)]
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
        return cls(proc, output)

    def finish(self, timeout: float) -> dict[str, Any]:
        """Wait for py-spy (it stops by itself after its duration) and summarise; ``raw`` names
        the collapsed stacks (relative to the repository when they are inside it)."""
        if self.proc is None:
            return {"problem": self.problem}
        try:
            _, stderr = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()  # our own child, by its PID
            _, stderr = self.proc.communicate()
        if self.proc.returncode != 0 or not self.output.exists():
            return {"problem": f"py-spy exited with {self.proc.returncode}: "
                               f"{stderr.decode(errors='replace')[-300:]}"}
        summary = summarise_collapsed(self.output.read_text())
        summary["raw"] = str(self.output.relative_to(REPO_ROOT)
                             if self.output.is_relative_to(REPO_ROOT) else self.output)
        return summary

    def stop(self) -> None:
        """Stop py-spy if it still runs (an error path left it before ``finish``)."""
        if self.proc is not None:
            stop_process(self.proc)


def _function_of(frame: str) -> tuple[str, str]:
    """('Store._eval', 'tubeq/store/store.py') from 'Store._eval (tubeq/store/store.py:117)'."""
    name, _, where = frame.rpartition(" (")
    return (name or frame), where.rstrip(")").rsplit(":", 1)[0]


def _area_of(path: str) -> str:
    for prefix, area in AREAS:
        if prefix in path:
            return area
    return "other (runpy, stdlib)"


def summarise_collapsed(text: str) -> dict[str, Any]:
    """Top functions by own and by inclusive samples, and samples per source area."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    areas: Counter[str] = Counter()
    total = 0
    for line in text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = [_function_of(f) for f in stack.split(";")]
        name, path = frames[-1]
        if (name, path) in EVENT_LOOP_FRAMES:
            own[EVENT_LOOP_LABEL] += count
            areas["uvloop event loop (C)"] += count
        else:
            own[f"{name} ({path})"] += count
            areas[_area_of(path)] += count
        for label in {f"{n} ({p})" for n, p in frames}:
            inclusive[label] += count
    if total == 0:
        return {"problem": "py-spy recorded no busy samples"}

    def share(counter: Counter[str], limit: int) -> list[tuple[str, float]]:
        return [(k, round(100.0 * v / total, 1)) for k, v in counter.most_common(limit)]

    inclusive_tubeq = Counter({k: v for k, v in inclusive.items() if "tubeq/" in k
                               and "__main__" not in k})
    return {"samples": total, "rate_hz": SAMPLE_RATE_HZ,
            "own": share(own, TOP_FUNCTIONS),
            "inclusive_tubeq": share(inclusive_tubeq, TOP_FUNCTIONS),
            "areas": share(areas, len(AREAS) + 1)}


# Commands that run a script: their commandstats time includes every command the script ran.
SCRIPT_RUNNERS = frozenset({"eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro"})
LUA_DIR = REPO_ROOT / "tubeq" / "store" / "lua"
_LUA_CALL = re.compile(r"""\b(?:redis\.p?call|rcall)\(\s*['"]([A-Za-z]+)['"]""")


def script_commands(lua_dir: Path = LUA_DIR) -> frozenset[str]:
    """The commands tubeq's Lua scripts call (lower case), read from their source."""
    return frozenset(name.lower() for path in lua_dir.rglob("*.lua")
                     for name in _LUA_CALL.findall(path.read_text()))


def redis_per_job(stats: dict[str, dict[str, float]], jobs: int) -> dict[str, Any]:
    """Redis calls and microseconds per job, by command, from INFO commandstats deltas.

    Redis counts a command a script runs both under its own name and inside the script's
    EVALSHA, so the plain sum over commands (``total_usec_per_job``) counts that time twice.
    ``top_level_usec_per_job`` is the time of the commands clients sent: the script calls plus
    every command no tubeq script calls (a command tubeq also sends directly, outside a script,
    is left out: none is on the put / reserve / delete path).
    """
    if jobs <= 0:
        return {}
    rows = sorted(((name, s["calls"] / jobs, s["usec"] / jobs) for name, s in stats.items()),
                  key=lambda r: -r[2])
    nested = script_commands() - SCRIPT_RUNNERS
    top = [r for r in rows if r[0] not in nested]
    return {"by_command": [(name, round(calls, 3), round(usec, 2)) for name, calls, usec in rows
                           if calls >= 0.001],
            "total_usec_per_job": round(sum(r[2] for r in rows), 2),
            "total_calls_per_job": round(sum(r[1] for r in rows), 3),
            "top_level_usec_per_job": round(sum(r[2] for r in top), 2),
            "top_level_calls_per_job": round(sum(r[1] for r in top), 3),
            "script_usec_per_job": round(sum(r[2] for r in rows if r[0] in SCRIPT_RUNNERS), 2)}
