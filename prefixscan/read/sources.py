"""Expanding input arguments (files, directories, globs) and fingerprinting them for the manifest."""

from __future__ import annotations

import glob
import os
import stat
from dataclasses import asdict, dataclass, field

import xxhash

from prefixscan.errors import InputError, UsageError
from prefixscan.read import remote

SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".json", ".json.gz", ".json.zst", ".ndjson", ".ndjson.gz",
            ".ndjson.zst", ".parquet", ".pq")


@dataclass(frozen=True)
class Source:
    """One input file and what the manifest records about it."""

    path: str
    size: int
    fingerprint: str
    kind: str  # "jsonl" or "parquet"

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def _kind(path: str) -> str | None:
    low = path.lower()
    if low.endswith((".parquet", ".pq")):
        return "parquet"
    return "jsonl" if low.endswith(SUFFIXES) else None


def fingerprint(path: str, size: int) -> str:
    """Cheap content fingerprint: size plus xxh3 of the first and last MiB (not a full-file hash)."""
    h = xxhash.xxh3_64()
    h.update(str(size).encode())
    with remote.open_random(path) if remote.is_uri(path) else open(path, "rb") as f:
        h.update(f.read(1 << 20))
        if size > 2 << 20:
            f.seek(size - (1 << 20))
            h.update(f.read(1 << 20))
    return h.hexdigest()


@dataclass
class Walk:
    """What expanding the inputs found: the log files to read (each file once, whatever the paths that
    reach it) and everything passed over, so the summary can say so rather than skip it silently."""

    files: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # no known log suffix
    dangling: list[str] = field(default_factory=list)  # symlinks whose target does not exist
    not_regular: list[str] = field(default_factory=list)  # FIFOs, sockets, devices inside a directory
    unreadable: list[str] = field(default_factory=list)  # directories that could not be listed
    duplicates: list[tuple[str, str]] = field(default_factory=list)  # (path passed over, the path read)
    stored: dict[str, int] = field(default_factory=dict)  # objects in a store (`remote`) and their sizes
    _ids: dict[tuple[int, int], str] = field(default_factory=dict)  # (st_dev, st_ino) -> the path read

    def add(self, path: str, st: os.stat_result | None = None) -> None:
        """Read `path` unless the same file (device and inode: a hard link or a symlink) is read already."""
        if st is None:
            try:
                st = os.stat(path)
            except OSError:
                self.files.append(path)  # `expand` reports why it cannot be read
                return
        key = (st.st_dev, st.st_ino)
        first = self._ids.get(key)
        if first is not None:
            if first != path:
                self.duplicates.append((path, first))
            return
        self._ids[key] = path
        self.files.append(path)

    def directory(self, root: str) -> None:
        """Every log file under `root`, sorted, following symlinked directories once (no cycles)."""
        seen_dirs: set[tuple[int, int]] = set()

        def visit(d: str) -> None:
            try:
                st = os.stat(d)
                if (st.st_dev, st.st_ino) in seen_dirs:
                    return
                seen_dirs.add((st.st_dev, st.st_ino))
                with os.scandir(d) as it:
                    entries = sorted(it, key=lambda e: e.name)
            except OSError:
                self.unreadable.append(d)
                return
            for e in entries:
                if self.entry(e.path, need_suffix=True):
                    visit(e.path)

        visit(root)

    def entry(self, path: str, need_suffix: bool) -> bool:
        """File a path met in a directory or a glob; True when it is a directory (to descend into)."""
        try:
            st = os.stat(path)  # follows symlinks
        except FileNotFoundError:
            if os.path.islink(path):
                self.dangling.append(path)
            return False
        except OSError:
            self.unreadable.append(path)
            return False
        if stat.S_ISDIR(st.st_mode):
            return True
        if not stat.S_ISREG(st.st_mode):
            self.not_regular.append(path)
        elif _kind(path) or not need_suffix:
            self.add(path, st)
        else:
            self.skipped.append(path)
        return False

    def notes(self) -> list[str]:
        """One line per kind of file passed over (the summary's notes)."""
        out = []
        if self.skipped:
            out.append(f"{len(self.skipped):,} file(s) in the input directories were skipped (not a known log "
                       f"suffix): {_shown(self.skipped)}; name them on the command line to read them.")
        for paths, what, hint in (
                (self.dangling, "are symlinks to nothing and were skipped", "fix or remove the links"),
                (self.not_regular, "are not regular files (FIFOs, sockets or devices) and were skipped",
                 "copy the data into a file to read it"),
                (self.unreadable, "could not be listed or read (permissions?) and were skipped",
                 "check their permissions")):
            if paths:
                out.append(f"{len(paths):,} path(s) among the inputs {what}: {_shown(paths)}; {hint}.")
        if self.duplicates:
            pairs = [f"{a} (= {b})" for a, b in self.duplicates]
            out.append(f"{len(pairs):,} input path(s) reach a file already read (a hard link or a symlink: same "
                       f"device and inode) and were not read again: {_shown(pairs)}.")
        return out


def _shown(items: list[str], limit: int = 5) -> str:
    return ", ".join(items[:limit]) + (f" and {len(items) - limit:,} more" if len(items) > limit else "")


def _not_regular(arg: str) -> str | None:
    """Why an existing path is not a log file that can be read, or None when it is a regular file."""
    try:
        mode = os.stat(arg).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    kind = ("a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a file")
    return (f"input {arg!r} is not a regular file ({kind}); prefixscan reads a log more than once (to sniff "
            "its layout, then its records): save the stream to a file first")


def walk(inputs: list[str] | tuple[str, ...], list_remote: bool = False) -> Walk:
    """The files `inputs` name (files, directories, globs), each file once, in argument order; objects in
    a store only with `list_remote` (listing them is a request to the store). An existing path is taken as
    itself even when its name holds glob characters (`[`, `*`, `?`). Raises InputError for an argument
    that names nothing readable."""
    w = Walk()
    for arg in inputs:
        if remote.is_uri(arg):
            if list_remote:
                found = remote.list_uri(arg, SUFFIXES)
                w.stored.update(found)
                w.files.extend(u for u, _ in found)
            continue
        if os.path.isdir(arg):
            before = len(w.files) + len(w.duplicates)
            w.directory(arg)
            if len(w.files) + len(w.duplicates) == before:
                raise InputError(f"directory {arg!r} holds no .jsonl, .json, .ndjson (optionally .gz or .zst) "
                                 "or .parquet files")
        elif os.path.isfile(arg):
            w.add(arg)
        elif os.path.lexists(arg) and (why := _not_regular(arg)):
            raise InputError(why)
        elif os.path.islink(arg):
            raise InputError(f"input {arg!r} is a symlink to {os.readlink(arg)!r}, which does not exist")
        elif any(ch in arg for ch in "*?["):
            matched = sorted(glob.glob(arg, recursive=True))
            if not matched:
                raise InputError(f"glob {arg!r} matched no files (and no file has that name)")
            for m in matched:
                w.entry(m, need_suffix=False)  # a directory a glob matches is not descended into, as before
        else:
            raise InputError(f"input {arg!r} does not exist; check the path")
    return w


def walk_notes(inputs: list[str] | tuple[str, ...]) -> list[str]:
    """The summary's notes on what the walk over the inputs passed over (see `Walk.notes`)."""
    try:
        return walk(inputs).notes()
    except InputError:  # the inputs changed since they were read: nothing to say about them
        return []


def expand(inputs: list[str]) -> list[Source]:
    """Resolve files, directories (recursively, known suffixes) and globs, sorted, without duplicates (the
    same file reached by two paths is read once, see `Walk`)."""
    if not inputs:
        raise InputError("no input logs given; pass one or more files, directories or globs")
    w = walk(inputs, list_remote=True)
    stored = w.stored
    out: list[Source] = []
    for p in dict.fromkeys(w.files):  # each path once, in order
        kind = _kind(p)
        if p in stored:
            out.append(Source(p, stored[p], fingerprint(p, stored[p]), kind or "jsonl"))
            continue
        try:
            if kind is None:  # an unknown suffix given explicitly: sniff the first bytes (PAR1 magic for Parquet)
                with open(p, "rb") as f:
                    kind = "parquet" if f.read(4) == b"PAR1" else "jsonl"
            size = os.path.getsize(p)
            out.append(Source(p, size, fingerprint(p, size), kind))
        except OSError as exc:
            raise InputError(f"cannot read input {p}: {exc.strerror or exc}; check its permissions") from None
    return out


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def check_output(output: str | os.PathLike[str], inputs: list[str] | tuple[str, ...], sources: list[Source],
                 what: str = "-o") -> None:
    """Refuse, before any work, an output that is an input (symlinks and hard links followed), holds an
    input (replacing it would delete the input), or lies inside an input directory (a later run over that
    directory would read the outputs as logs)."""
    out = os.path.realpath(output)
    try:
        out_id = os.stat(out)[1:3] if os.path.exists(out) else None  # (inode, device)
    except OSError:
        out_id = None
    for src in sources:
        if remote.is_uri(src.path):  # an object in a store is never a local output
            continue
        real = os.path.realpath(src.path)
        same = real == out or (out_id is not None and os.stat(real)[1:3] == out_id)
        if same:
            raise UsageError(f"{what} {output} is the input {src.path}: writing it would destroy the input; "
                             "choose another output path")
        if _inside(real, out):
            raise UsageError(f"{what} {output} holds the input {src.path}: writing there could overwrite or "
                             "delete the input; choose an output outside the inputs")
    for arg in inputs:
        if os.path.isdir(arg) and _inside(out, os.path.realpath(arg)):
            raise UsageError(f"{what} {output} is inside the input directory {arg}: a later run over that "
                             "directory would read the outputs as logs; choose an output outside it")
