"""Where each peer's client comes from, and which versions ran.

Owns: the per-system virtualenvs of the Python peers (bench/out/peer-venvs/<system>, each from
the pinned list of the pyproject extra ``bench-peer-<system>``; the project itself is not
installed there: the driver modules are found through PYTHONPATH) and the Node modules of
BullMQ (bench/peers/node, ``npm ci`` from the committed package-lock.json). An environment is
rebuilt only when its list changes. A failed install raises :class:`EnvError` with the tail of
the installer's output: the orchestrator reports that system as failed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from bench.harness.paths import BENCH_DIR, OUT_DIR, REPO_ROOT

VENV_DIR = OUT_DIR / "peer-venvs"
NODE_DIR = BENCH_DIR / "peers" / "node"
NODE_DRIVER = NODE_DIR / "bullmq_driver.js"
NODE_STAMP = NODE_DIR / "node_modules" / ".installed"
INSTALL_TIMEOUT_S = 900.0
# The packages whose versions the report records, per system.
PYTHON_PACKAGES = {
    "saq": ("saq", "redis", "hiredis", "uvloop"),
    "arq": ("arq", "redis", "hiredis", "uvloop"),
    "rq": ("rq", "redis", "hiredis"),
    "celery": ("celery", "kombu", "redis", "hiredis"),
    "dramatiq": ("dramatiq", "redis", "hiredis"),
}
NODE_PACKAGES = ("bullmq", "ioredis")


class EnvError(RuntimeError):
    """A system's client could not be installed."""


def requirements(system: str) -> list[str]:
    """The pinned requirements of ``system`` (pyproject extra ``bench-peer-<system>``)."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    extra = f"bench-peer-{system}"
    try:
        return list(project["optional-dependencies"][extra])
    except KeyError:
        raise EnvError(f"pyproject.toml has no extra {extra!r}") from None


def _run(command: list[str], cwd: Path | None = None) -> None:
    try:
        done = subprocess.run(command, cwd=cwd, capture_output=True, text=True,
                              timeout=INSTALL_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EnvError(f"{' '.join(command[:3])}...: {exc}") from exc
    if done.returncode != 0:
        tail = "\n".join(line for line in (done.stderr or done.stdout).splitlines()
                         if "is ignored" not in line)[-800:]
        raise EnvError(f"{' '.join(command[:4])}... exited {done.returncode}: {tail}")


def python_env(system: str) -> Path:
    """The interpreter of ``system``'s virtualenv, installed or refreshed as needed."""
    wanted = requirements(system)
    venv = VENV_DIR / system
    stamp = venv / "bench-requirements.json"
    python = venv / "bin" / "python"
    if python.exists() and stamp.exists() and json.loads(stamp.read_text()) == wanted:
        return python
    shutil.rmtree(venv, ignore_errors=True)
    VENV_DIR.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "venv", str(venv)])
    _run([str(python), "-m", "pip", "install", "--quiet", *wanted])
    stamp.write_text(json.dumps(wanted))
    return python


def node_env() -> list[str]:
    """The command that runs the BullMQ driver, after ``npm ci`` when the lock file changed."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        raise EnvError("node/npm not on PATH (`make client-deps` installs nodejs npm)")
    lock = NODE_DIR / "package-lock.json"
    if not NODE_STAMP.exists() or NODE_STAMP.stat().st_mtime < lock.stat().st_mtime:
        _run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=NODE_DIR)
        NODE_STAMP.touch()
    return [node, str(NODE_DRIVER)]


def python_versions(python: Path, system: str) -> dict[str, str]:
    code = ("import json, sys\nfrom importlib import metadata\nout = {}\n"
            "for name in sys.argv[1:]:\n"
            "    try: out[name] = metadata.version(name)\n"
            "    except metadata.PackageNotFoundError: out[name] = 'not installed'\n"
            "out['python'] = sys.version.split()[0]\nprint(json.dumps(out))")
    done = subprocess.run([str(python), "-c", code, *PYTHON_PACKAGES[system]],
                          capture_output=True, text=True, timeout=60, check=False)
    return json.loads(done.stdout) if done.returncode == 0 else {"error": done.stderr[-200:]}


def node_versions() -> dict[str, str]:
    out = {}
    for name in NODE_PACKAGES:
        manifest = NODE_DIR / "node_modules" / name / "package.json"
        out[name] = json.loads(manifest.read_text())["version"] if manifest.exists() \
            else "not installed"
    done = subprocess.run(["node", "--version"], capture_output=True, text=True, timeout=30,
                          check=False)
    out["node"] = done.stdout.strip() or "unknown"
    return out
