"""Which machine and code a benchmark ran on, and whether a run may be compared with the
committed results.

Owns: the machine and versions table a RESULTS file opens with (CPU, memory, OS, Python, the
client libraries, redis-server, beanstalkd, tubeq's version and commit); the fingerprint of the
tubeq source a run measured; the CPU model (lscpu's "Model name"); the machine-readable summary
line a RESULTS file carries (an HTML comment: the CPU model and the run's headline figures); and
the rule: a run compares its figures with the committed file's only when the CPU models are the
same; otherwise it says so and compares nothing (the same code measured 0.72x of beanstalkd on
an AMD EPYC and 0.36x on an Intel Xeon of the same machine kind).

The committed file is read with ``git show HEAD:<path>``, so a run that rewrites the file in the
working tree still compares with what is committed. A committed file written before the summary
line existed is read for its CPU only (the ``| cpu | <model>, N cores |`` row of RESULTS.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

from bench.harness.paths import REPO_ROOT

SUMMARY_PREFIX = "<!-- bench-summary: "
SUMMARY_SUFFIX = " -->"
_CPU_ROW = re.compile(r"^\| cpu \| (?P<model>.+?)(?:, \d+ cores)? \|$", re.MULTILINE)


def cpu_model() -> str:
    """lscpu's "Model name" (the same string as /proc/cpuinfo's "model name")."""
    try:
        done = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10,
                              check=False, env={"LC_ALL": "C"})
        for line in done.stdout.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def summary_line(cpu: str, figures: dict[str, float | None]) -> str:
    """The comment a RESULTS file ends with: its CPU model and headline figures."""
    return SUMMARY_PREFIX + json.dumps({"cpu_model": cpu, "figures": figures}) + SUMMARY_SUFFIX


def read_summary(text: str) -> dict[str, Any] | None:
    """The summary of a RESULTS file's text: its summary line, or else the CPU of its machine
    table with no figures; None when it names no CPU."""
    for line in text.splitlines():
        if line.startswith(SUMMARY_PREFIX) and line.endswith(SUMMARY_SUFFIX):
            summary: dict[str, Any] = json.loads(line[len(SUMMARY_PREFIX):-len(SUMMARY_SUFFIX)])
            return summary
    match = _CPU_ROW.search(text)
    return {"cpu_model": match["model"], "figures": {}} if match else None


def committed_summary(path: Path) -> dict[str, Any] | None:
    """The summary of ``path`` as committed at HEAD (None: not committed, or no CPU named)."""
    root = REPO_ROOT
    try:
        done = subprocess.run(["git", "-C", str(root), "show",
                               f"HEAD:{path.resolve().relative_to(root)}"],
                              capture_output=True, text=True, timeout=30, check=False)
    except (OSError, ValueError):
        return None
    if done.returncode != 0:
        return None
    summary = read_summary(done.stdout)
    if summary is not None:
        commit = subprocess.run(["git", "-C", str(root), "log", "-1", "--format=%h %cI", "--",
                                 str(path.resolve().relative_to(root))],
                                capture_output=True, text=True, timeout=30, check=False)
        summary["commit"] = commit.stdout.strip()
    return summary


def comparison(name: str, cpu: str, figures: dict[str, float | None],
               committed: dict[str, Any] | None) -> list[str]:
    """Markdown lines: this run against the committed ``name``, or why it is not compared."""
    title = f"## This run against the committed {name}"
    if committed is None:
        return [title, "", f"No committed {name} names a CPU model: nothing to compare with.", ""]
    where = f" (commit {committed['commit']})" if committed.get("commit") else ""
    theirs = committed.get("cpu_model", "unknown")
    if theirs != cpu:
        return [title, "",
                f"**Not compared: different CPU.** The committed {name}{where} was measured on "
                f"`{theirs}`, this run on `{cpu}`. Ratios to beanstalkd and the figures "
                "themselves move with the CPU (issue 13: 0.72x on an AMD EPYC, 0.36x on an "
                "Intel Xeon, same code), so only figures measured in the same run are compared "
                "here.", ""]
    old = committed.get("figures") or {}
    keys = [k for k in figures if k in old]
    if not keys:
        return [title, "",
                f"Same CPU (`{cpu}`) as the committed {name}{where}, but it carries no "
                "machine-readable figures (written before the summary line): compare the "
                "tables by eye.", ""]
    lines = [title, "",
             f"Same CPU (`{cpu}`) as the committed {name}{where}: its headline figures next "
             "to this run's (noise on a shared 2-core machine is +-10 % or more).", "",
             "| figure | committed | this run | this run / committed |", "|---|---|---|---|"]
    for key in keys:
        now, then = figures[key], old[key]
        ratio = f"{now / then:.2f}x" if now is not None and then else "n/a"
        lines.append(f"| {key} | {_num(then)} | {_num(now)} | {ratio} |")
    return [*lines, ""]


def _num(v: float | None) -> str:
    return "n/a" if v is None else f"{v:,.0f}" if abs(v) >= 100 else f"{v:.2f}"


# -- the machine and versions a run names ----------------------------------------------------

def source_fingerprint(root: Path) -> str:
    """A hash of every file of the tubeq package under ``root``: the code tubeq runs."""
    digest = hashlib.sha256()
    package = root / "tubeq"
    for path in sorted(package.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(package)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def _first_line(command: list[str]) -> str:
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=10, check=False)
    except OSError:
        return "not found"
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr) \
        else "unknown"


def _package(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def machine_and_versions() -> dict[str, str]:
    commit = _first_line(["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"])
    status = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain", "tubeq"],
                            capture_output=True, text=True, check=False).stdout.strip()
    os_release = "unknown"
    for line in Path("/etc/os-release").read_text().splitlines():
        if line.startswith("PRETTY_NAME="):
            os_release = line.split("=", 1)[1].strip('"')
    return {
        "cpu": f"{cpu_model()}, {_cores()} cores",
        "memory": f"{_mem_total_gib():.0f} GiB",
        "os": f"{os_release}, kernel {platform.release()}",
        "python": platform.python_version(),
        "uvloop": _package("uvloop"), "hiredis": _package("hiredis"),
        "redis-py": _package("redis"), "py-spy": _package("py-spy"),
        "redis-server": _first_line(["redis-server", "--version"]),
        "beanstalkd": _first_line(["beanstalkd", "-v"]),
        "tubeq": f"{_package_version()} at commit {commit}"
                 + (" with uncommitted changes under tubeq/" if status else ""),
    }


def _cores() -> int:
    return os.cpu_count() or 0


def _mem_total_gib() -> float:
    with open("/proc/meminfo") as f:
        return int(f.readline().split()[1]) / (1 << 20)


def _package_version() -> str:
    from tubeq import __version__
    return __version__
