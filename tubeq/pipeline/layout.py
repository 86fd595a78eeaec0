"""The archive's folder on disk: its layout, what in it is not the archive's, the old format.

Owns the names of an archive folder and every check or repair of one that needs no Spark:
``tubeq-pipeline archive --check DIR`` (partial and foreign files), ``--clean DIR`` (remove them),
``--convert DIR`` (an archive of the old format, written by Spark's file sink, into this one),
and the file operations the archive publishes a batch with (:class:`LocalFiles`, and
``archive.HadoopFiles`` for hdfs://, s3a://, ... folders).

Layout: ``DIR/batch=<N>/date=<YYYY-MM-DD>/tube=<name>/<part>.parquet``, and nothing else. ``N``
is the Structured Streaming batch id that wrote the files; ``date`` and ``tube`` are the events'
UTC day and tube. Every path is relative to ``DIR`` and no file lists another, so a copied
(``cp -r``) or moved folder is the same archive.

Why a batch directory: every Parquet reader lists files, and they do not agree on what a
listing skips. Spark and pyarrow (so pandas) skip names that start with ``_`` or ``.``; DuckDB's
``read_parquet('DIR/**/*.parquet')`` skips nothing (checked with DuckDB 2.0.1: it reads
``_staging/``, ``.staging/``, ``.f.parquet`` and ``_f.parquet`` alike). So nothing unfinished may
ever be under ``DIR``: a batch is written by Spark into the checkpoint (``CHECKPOINT/staging/
batch=<N>/``), and published by renaming that one directory to ``DIR/batch=<N>``. A rename is
atomic, so a reader lists either none of a batch's files or all of them, whole: the folder holds
exactly the batches published, each once, at every moment, including right after a kill -9. A
batch that is published is never written again: Spark replays an unfinished batch with the same
id and offsets (its checkpoint's offset log), and the replay finds ``batch=<N>`` in place and
keeps it.

The old format (``DIR/date=.../tube=.../part-*.parquet`` with Spark's ``_spark_metadata`` log,
which holds absolute paths) is read right only by Spark, and only where it was written: its
partial files (a batch killed halfway) are read by the other readers, and a moved copy makes
Spark read the wrong files or fail. Both the archive and ``report.read_archive`` refuse it with
one line naming ``--convert``, which moves each file the log lists into its batch's directory,
drops the files it does not list (a killed batch's: the query replays that batch) and then the
log.

Rules: nothing here imports Spark, so these commands answer without a JVM; every error is a
:class:`~tubeq.pipeline.session.PipelineError` of one line.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol
from urllib.parse import unquote, urlsplit

from tubeq.pipeline.session import PipelineError

BATCH_KEY: Final = "batch"
DATE_KEY: Final = "date"
TUBE_KEY: Final = "tube"
# The archive's Hive-style partition keys, below the batch directory.
ARCHIVE_PARTITIONS: Final = (DATE_KEY, TUBE_KEY)
# Where the archive stages a batch before publishing it: inside the checkpoint, never under DIR.
STAGING: Final = "staging"
# Spark's file-sink log: the mark of an archive of the old format.
OLD_LOG: Final = "_spark_metadata"
CONVERT_HINT: Final = "tubeq-pipeline archive --convert"
PARQUET_MAGIC: Final = b"PAR1"
# A Parquet file is at least its leading magic, a footer length and its trailing magic.
PARQUET_MIN_SIZE: Final = 12

_BATCH_DIR: Final = re.compile(rf"^{BATCH_KEY}=(\d+)$")
_DATE_DIR: Final = re.compile(rf"^{DATE_KEY}=\d{{4}}-\d{{2}}-\d{{2}}$")
_TUBE_DIR: Final = re.compile(rf"^{TUBE_KEY}=.+$")


def batch_dir_name(batch_id: int) -> str:
    """The directory name of batch ``batch_id`` (``batch=N``)."""
    return f"{BATCH_KEY}={batch_id}"


def local_path(location: str | Path) -> Path | None:
    """The local file system path of ``location`` (a plain path or a ``file:`` URL); None for
    any other scheme (hdfs://, s3a://, ...), which only Spark can look at."""
    if isinstance(location, Path):
        return location
    parts = urlsplit(location)
    if parts.scheme == "file":
        return Path(unquote(parts.path))
    return Path(location) if not parts.scheme or len(parts.scheme) == 1 else None


def staging_dir(checkpoint: str) -> str:
    """Where batches are staged: ``CHECKPOINT/staging`` (same form as ``checkpoint``)."""
    return f"{checkpoint.rstrip('/')}/{STAGING}"


def is_old_format(root: Path) -> bool:
    """Whether ``root`` is an archive of the old format (it holds Spark's file-sink log)."""
    return (root / OLD_LOG).is_dir()


def old_format_error(location: str) -> PipelineError:
    """The one line that refuses an archive of the old format and says how to convert it."""
    return PipelineError(
        f"{location} is an archive of the old format (Spark's {OLD_LOG} log of absolute paths, "
        f"which only Spark reads right, and only where it was written); convert it once: "
        f"{CONVERT_HINT} {location}")


def published_batches(root: Path) -> list[int]:
    """The ids of the batches published in ``root``, ascending (none if it does not exist)."""
    if not root.is_dir():
        return []
    found = (_BATCH_DIR.match(entry.name) for entry in root.iterdir() if entry.is_dir())
    return sorted(int(match.group(1)) for match in found if match)


def is_whole_parquet(path: Path) -> bool:
    """Whether ``path`` starts and ends with Parquet's magic: a file cut short has no footer."""
    try:
        size = path.stat().st_size
        if size < PARQUET_MIN_SIZE:
            return False
        with path.open("rb") as handle:
            head = handle.read(len(PARQUET_MAGIC))
            handle.seek(-len(PARQUET_MAGIC), os.SEEK_END)
            return head == PARQUET_MAGIC and handle.read() == PARQUET_MAGIC
    except OSError:
        return False


# ---------------------------------------------------------------------------------------------
# Publishing a staged batch: the file operations, local here (Hadoop's in archive.py).
# ---------------------------------------------------------------------------------------------


class Files(Protocol):
    """The file operations a batch is published with, on locations as the user gave them."""

    def exists(self, location: str) -> bool: ...

    def remove_tree(self, location: str) -> None: ...

    def make_dirs(self, location: str) -> None: ...

    def tidy(self, stage: str) -> bool: ...

    def rename(self, source: str, target: str) -> None: ...


class LocalFiles:
    """The publish steps on a local file system (plain paths or ``file:`` URLs)."""

    def exists(self, location: str) -> bool:
        return _local(location).exists()

    def remove_tree(self, location: str) -> None:
        shutil.rmtree(_local(location), ignore_errors=True)

    def make_dirs(self, location: str) -> None:
        _local(location).mkdir(parents=True, exist_ok=True)

    def tidy(self, stage: str) -> bool:
        """Leave in ``stage`` only the Parquet files of ``date=/tube=`` directories (Spark's
        ``_SUCCESS``, ``.crc`` checksums and an empty batch's root file go); whether any remain."""
        kept = False
        for path in _walk_outside_in(_local(stage)):
            if not path.at_layout_place or (len(path.parts) == 3
                                            and not is_layout_file(path.parts)):
                _remove(path.full)
            elif len(path.parts) == 3:
                kept = True
        return kept

    def rename(self, source: str, target: str) -> None:
        os.rename(_local(source), _local(target))


def _local(location: str) -> Path:
    path = local_path(location)
    if path is None:
        raise PipelineError(f"{location}: not a local path")
    return path


def is_layout_file(relative: tuple[str, ...]) -> bool:
    """Whether ``relative`` (below a batch directory) is ``date=D/tube=T/<part>.parquet``."""
    return (len(relative) == 3 and bool(_DATE_DIR.match(relative[0]))
            and bool(_TUBE_DIR.match(relative[1])) and relative[2].endswith(".parquet")
            and not relative[2].startswith(("_", ".")))


@dataclass(frozen=True)
class _Entry:
    full: Path
    parts: tuple[str, ...]  # below the batch directory

    @property
    def at_layout_place(self) -> bool:
        """A ``date=`` directory, a ``tube=`` directory in one, or a file in that."""
        depth = len(self.parts)
        is_dir = self.full.is_dir() and not self.full.is_symlink()
        return (bool(_DATE_DIR.match(self.parts[0]))
                and (depth < 2 or bool(_TUBE_DIR.match(self.parts[1])))
                and ((depth < 3 and is_dir) or (depth == 3 and not is_dir)))


def _walk_outside_in(batch: Path) -> Iterator[_Entry]:
    """Every entry below ``batch``, a directory before what it holds; what is not at a layout
    place is given and not entered (the caller removes or reports it whole)."""
    pending = [_Entry(child, (child.name,)) for child in sorted(batch.iterdir())]
    while pending:
        entry = pending.pop(0)
        yield entry
        if entry.at_layout_place and len(entry.parts) < 3:
            pending[:0] = [_Entry(child, (*entry.parts, child.name))
                           for child in sorted(entry.full.iterdir())]


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def same_file_system(out: Path, checkpoint: Path) -> bool:
    """Whether ``out`` and ``checkpoint`` (created if missing) are on one file system, so a
    staged batch can be renamed from one into the other."""
    out.mkdir(parents=True, exist_ok=True)
    checkpoint.mkdir(parents=True, exist_ok=True)
    return out.stat().st_dev == checkpoint.stat().st_dev


# ---------------------------------------------------------------------------------------------
# --check and --clean: what in an archive folder is not the archive's.
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    """Something in an archive folder that no reader should read: ``kind`` is ``partial`` (a
    file cut short) or ``foreign`` (not of the layout); ``path`` is relative to the folder."""

    path: str
    kind: str
    why: str


def inspect(root: Path) -> list[Finding]:
    """Every partial or foreign file or directory in archive folder ``root``, in path order (a
    foreign directory once, not its contents)."""
    findings: list[Finding] = []
    for entry in sorted(root.iterdir()):
        if entry.is_dir() and not entry.is_symlink() and _BATCH_DIR.match(entry.name):
            findings.extend(_inspect_batch(root, entry))
        elif entry.name == OLD_LOG:
            findings.append(_foreign(root, entry, f"Spark's file-sink log of the old format: "
                                                  f"{CONVERT_HINT}"))
        else:
            findings.append(_foreign(root, entry, "not a batch=N directory"))
    return findings


_NOT_AT_PLACE: Final = ("not a date=YYYY-MM-DD directory", "not a tube=NAME directory",
                        "not a Parquet file of the archive")


def _inspect_batch(root: Path, batch: Path) -> Iterator[Finding]:
    for entry in _walk_outside_in(batch):
        depth = len(entry.parts)
        if not entry.at_layout_place:
            yield _foreign(root, entry.full, _NOT_AT_PLACE[min(depth, 3) - 1])
        elif depth == 3 and not is_layout_file(entry.parts):
            yield _foreign(root, entry.full, _NOT_AT_PLACE[2])
        elif depth == 3 and not is_whole_parquet(entry.full):
            yield Finding(_relative(root, entry.full), "partial",
                          f"not a whole Parquet file ({entry.full.stat().st_size} bytes, "
                          "no footer): cut short")


def _foreign(root: Path, path: Path, why: str) -> Finding:
    return Finding(_relative(root, path) + ("/" if path.is_dir() else ""), "foreign", why)


def _relative(root: Path, path: Path) -> str:
    return path.relative_to(root).as_posix()


def inspect_old_format(root: Path) -> list[Finding]:
    """The partial files of an archive of the old format: Parquet files its log does not list
    (a batch killed before it committed), which every reader but Spark reads."""
    listed = {relative for _, relative in _old_log_entries(root)}
    return [Finding(relative, "partial", f"not listed in {OLD_LOG}: a batch that never "
                                         "committed")
            for relative in _old_data_files(root) if relative not in listed]


def clean(root: Path, findings: list[Finding]) -> None:
    """Remove what ``findings`` (of :func:`inspect`) name from ``root``."""
    for finding in findings:
        _remove(root / finding.path.rstrip("/"))


# ---------------------------------------------------------------------------------------------
# --convert: the old format (Spark's file sink) into batch directories.
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Conversion:
    """What ``--convert`` did: files moved into batches, and unlisted (partial) files dropped."""

    moved: int
    batches: int
    dropped: list[str]


def convert(root: Path) -> Conversion:
    """Turn old-format archive ``root`` into the layout in place: each file Spark's log lists goes
    to ``batch=<N>/`` (the files of a compacted log entry to the compaction's batch), the
    unlisted ones are removed, then the log. Run again after an interruption, it goes on."""
    if not is_old_format(root):
        raise PipelineError(f"--convert {root}: not an archive of the old format (no {OLD_LOG})")
    entries = _old_log_entries(root)
    moved: set[int] = set()
    for batch_id, relative in entries:
        source = root / relative
        target = root / batch_dir_name(batch_id) / relative
        if target.is_file() and not source.exists():
            moved.add(batch_id)  # moved by an interrupted conversion
            continue
        if not source.is_file():
            raise PipelineError(f"--convert {root}: {relative}, listed in {OLD_LOG} (batch "
                                f"{batch_id}), is missing: the archive is incomplete")
        target.parent.mkdir(parents=True, exist_ok=True)
        os.rename(source, target)
        moved.add(batch_id)
    dropped = _old_data_files(root)
    for entry in root.glob(f"{DATE_KEY}=*"):  # what is left there is what the log did not list
        shutil.rmtree(entry)
    for batch in root.iterdir():  # Spark's checksums of the moved files
        for crc in batch.rglob(".*.crc"):
            crc.unlink()
    shutil.rmtree(root / OLD_LOG)
    return Conversion(len(entries), len(moved), dropped)


def _old_log_entries(root: Path) -> list[tuple[int, str]]:
    """(batch id, path relative to ``root``) of every file the old log lists: those of its
    latest compaction (``N.compact``, all batches up to N: given batch N) and of later batches."""
    log = root / OLD_LOG
    names = [entry.name for entry in log.iterdir() if not entry.name.startswith(".")]
    compactions = [int(name.removesuffix(".compact")) for name in names
                   if name.endswith(".compact") and name.removesuffix(".compact").isdigit()]
    since = max(compactions, default=-1)
    batches = sorted(int(name) for name in names if name.isdigit() and int(name) > since)
    files = ([(since, log / f"{since}.compact")] if since >= 0 else []) + [
        (batch, log / str(batch)) for batch in batches]
    entries: list[tuple[int, str]] = []
    for batch_id, file in files:
        for line in file.read_text().splitlines()[1:]:  # the first line is the log's version
            if line.strip():
                entries.append((batch_id, _relative_to_archive(json.loads(line)["path"])))
    return entries


def _relative_to_archive(uri: str) -> str:
    """``date=D/tube=T/<file>`` of a path the old log holds (an absolute URI, which may name
    where the archive was before it moved)."""
    parts = unquote(urlsplit(uri).path).rstrip("/").split("/")
    return "/".join(parts[-3:])


def _old_data_files(root: Path) -> list[str]:
    """The Parquet files under an old-format archive's ``date=/tube=`` directories."""
    return sorted(_relative(root, path) for path in root.glob("date=*/tube=*/*.parquet")
                  if not path.name.startswith((".", "_")))
