"""The archive command's arguments as the tests give them (parsed by the command's own parser)."""

from __future__ import annotations

import argparse
from pathlib import Path

from tubeq.pipeline import archive


def archive_args(url: str, prefix: str, out: Path, checkpoint: Path,
                 *extra: str) -> argparse.Namespace:
    """``archive --redis URL --prefix P --out OUT --checkpoint CHECKPOINT EXTRA...``, parsed."""
    parser = argparse.ArgumentParser()
    archive.add_archive_arguments(parser)
    return parser.parse_args(["--redis", url, "--prefix", prefix, "--out", str(out),
                              "--checkpoint", str(checkpoint), *extra])
