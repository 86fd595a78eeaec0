"""``python -m tubeq.pipeline``: the same as the ``tubeq-pipeline`` command."""

from __future__ import annotations

from tubeq.pipeline.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
