"""Where the benchmark lives and writes: the repository, bench/, and bench/out/ (ignored by git).

Owns: these three paths. Rules: a RESULTS file a scenario commits goes in BENCH_DIR; raw results,
logs, snapshots and quick reports go in OUT_DIR.
"""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
BENCH_DIR = REPO_ROOT / "bench"
OUT_DIR = BENCH_DIR / "out"
