"""A study's run records as data: one gzip-compressed JSON Lines file per study, read and written only through here.

A study's run directory (``benchmarks/results/<study>_runs``, or the ``--root`` a test gives) keeps its records in
``<root>/runs.jsonl.gz``, one line per record: ``{"key": name, "value": record}``. A record's name is its path under
the root in the tree of loose files the records were consolidated from (``demo/seed0/grpo.done.json``,
``demo/seed0/grpo.jsonl``, ``shared/delayed_H16_r0.15/grpo_seed3.json``), so it says which cell, seed and arm it
holds; a JSON Lines log's record is the list of its rows. Checkpoints and a run's log while it runs stay loose files
beside the archive (git-ignored): only finished records go in.

A driver that resumes appends (:func:`append_run`): the file is a sequence of gzip members, which a gzip reader reads
as one stream, and a name written again replaces the earlier record (the last line wins). Readers get copies, so a
caller that edits a record edits its own.

    python benchmarks/_runs.py pack <root> <file>...   # move loose record files under <root> into its archive
"""

from __future__ import annotations

import contextlib
import copy
import fnmatch
import gzip
import json
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: The archive's file name inside a study's run directory.
RUNS_FILE = "runs.jsonl.gz"
_MISSING = object()
#: Parsed archives by path, with the (mtime, size) they were read at: a study's report reads its records many times.
_CACHE: dict[Path, tuple[tuple[int, int], dict[str, Any]]] = {}


def runs_file(root: Path) -> Path:
    """The archive of the run directory ``root``."""
    return Path(root) / RUNS_FILE


def _records(root: Path) -> dict[str, Any]:
    """The archive's records by name, parsed once per change of the file (the cache's own dict: do not edit)."""
    path = runs_file(root).resolve()
    try:
        stat = path.stat()
    except FileNotFoundError:
        return {}
    stamp = (stat.st_mtime_ns, stat.st_size)
    cached = _CACHE.get(path)
    if cached is None or cached[0] != stamp:
        records: dict[str, Any] = {}
        with path.open("rb") as raw, _locked(raw, exclusive=False):
            text = _whole_members(raw.read(), path)
        for line in text.splitlines():
            if line.strip():
                row = json.loads(line)
                records[row["key"]] = row["value"]
        cached = _CACHE[path] = (stamp, records)
    return cached[1]


def _whole_members(data: bytes, path: Path) -> str:
    """The text of every whole gzip member of ``data``: a last member cut short (a process killed while it appended)
    is dropped with a warning, and every record before it is kept."""
    texts = []
    while data:
        member = zlib.decompressobj(wbits=31)
        try:
            texts.append(member.decompress(data).decode("utf-8"))
        except zlib.error:
            print(
                f"warning: {path} has a damaged gzip member; the records before it are kept", file=sys.stderr
            )
            break
        if not member.eof:
            texts.pop()
            print(
                f"warning: {path} ends in a cut gzip member; the records before it are kept", file=sys.stderr
            )
            break
        data = member.unused_data
    return "".join(texts)


def _matches(key: str, pattern: str) -> bool:
    """``pattern`` matched as a glob over ``/``-separated names: ``*`` stays inside one part, as ``Path.glob``'s."""
    parts, wanted = key.split("/"), pattern.split("/")
    return len(parts) == len(wanted) and all(
        fnmatch.fnmatchcase(p, w) for p, w in zip(parts, wanted, strict=True)
    )


def run_keys(root: Path, pattern: str = "**") -> list[str]:
    """The sorted names of ``root``'s records that match ``pattern`` (glob-like, e.g. ``*/seed*/*.done.json``;
    ``**``, the default, is every record)."""
    keys = _records(root)
    if pattern == "**":
        return sorted(keys)
    return sorted(k for k in keys if _matches(k, pattern))


def load_runs(root: Path, pattern: str = "**", *, appended: bool = False) -> dict[str, Any]:
    """``{name: record}`` of ``root``'s records that match ``pattern`` (see :func:`run_keys`), sorted by name, or in
    the order they were first appended with ``appended=True`` (a study whose summary names how many of its first
    records it was made from)."""
    records = _records(root)
    keys = run_keys(root, pattern)
    if appended:
        wanted = set(keys)
        keys = [k for k in records if k in wanted]
    return {k: copy.deepcopy(records[k]) for k in keys}


def has_run(root: Path, key: str) -> bool:
    """Whether ``root`` holds a record named ``key``."""
    return key in _records(root)


def read_run(root: Path, key: str, default: Any = _MISSING) -> Any:
    """The record named ``key`` (a copy); ``default`` when there is none, or a ``KeyError`` without a default."""
    records = _records(root)
    if key not in records:
        if default is _MISSING:
            raise KeyError(f"{runs_file(root)} holds no record {key!r}")
        return default
    return copy.deepcopy(records[key])


def append_run(root: Path, key: str, value: Any) -> None:
    """Append the record ``key`` to ``root``'s archive (replacing an earlier one of the name), creating it if needed."""
    append_runs(root, [(key, value)])


def append_runs(root: Path, items: list[tuple[str, Any]]) -> None:
    """Append the records ``[(key, value), ...]`` to ``root``'s archive as one gzip member, in one write under an
    exclusive lock: two processes of one study (e.g. two halves of its seeds) can append to the same archive."""
    path = runs_file(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps({"key": k, "value": v}) + "\n" for k, v in items)
    # mtime=0: the same records give the same bytes (no timestamp in the member's header)
    member = gzip.compress(text.encode("utf-8"), mtime=0)
    with path.open("ab") as f, _locked(f, exclusive=True):
        f.write(member)


@contextlib.contextmanager
def _locked(f: Any, *, exclusive: bool) -> Iterator[None]:
    """An advisory lock on the open archive ``f`` (none where ``fcntl`` is missing): a reader never sees half a
    member, and appends never interleave."""
    try:
        import fcntl
    except ImportError:  # not POSIX: one process per archive
        yield
        return
    fcntl.flock(f.fileno(), fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
    try:
        yield
    finally:
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def read_loose(path: Path) -> Any:
    """A loose record file's record: a JSON Lines log (``*.jsonl``) as the list of its rows, any other as its JSON."""
    text = Path(path).read_text(encoding="utf-8")
    if Path(path).suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return json.loads(text)


def pack(root: Path, files: list[Path]) -> int:
    """Move the loose record files ``files`` (under ``root``) into ``root``'s archive, in name order, and delete
    them; returns how many. A file whose name the archive holds replaces that record."""
    root = Path(root)
    items = sorted((Path(f).resolve().relative_to(root.resolve()).as_posix(), Path(f)) for f in files)
    append_runs(root, [(key, read_loose(f)) for key, f in items])
    for _, f in items:
        f.unlink()
    return len(items)


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] != "pack":
        raise SystemExit(__doc__.rsplit("\n\n", 1)[-1])
    print(
        f"packed {pack(Path(sys.argv[2]), [Path(p) for p in sys.argv[3:]])} records into {runs_file(sys.argv[2])}"
    )
