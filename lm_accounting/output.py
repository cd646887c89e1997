"""Writing report files and output sets.

- ``write_atomic`` / ``write_with``: each file appears complete or not at all (temp file + ``os.replace``).
- ``atomic_dir``: a whole output directory (``report``, ``sweep``) is built in a temporary directory
  beside the target and swapped in at the end, under an exclusive lock (see its docstring).
- ``safe_filename``: the one place where a name (a model's) becomes part of a file name.

Every write error (disk full, a path component that is a file, permission denied) becomes a
one-line ``AccountingError`` that names the path.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import hashlib
import json
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from .config import AccountingError
from .views.tables import Table, render_csv, render_markdown, render_records_csv


def _why(err: BaseException) -> str:
    return (getattr(err, "strerror", None) or str(err) or type(err).__name__).rstrip(".")


def write_error(path: Path | str, err: OSError) -> AccountingError:
    """The one-line error for a failed write: ``cannot write PATH: No space left on device``."""
    return AccountingError(f"cannot write {path}: {_why(err)}")


# ----------------------------------------------------------------- single files
def write_atomic(path: Path, data: str | bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same directory."""
    return write_with(path, lambda tmp: Path(tmp).write_bytes(data.encode() if isinstance(data, str) else data))


def write_with(path: Path, writer: Callable[[str], Any]) -> Path:
    """Call ``writer(temp_path)`` and move the result onto ``path`` atomically.

    An ``OSError`` anywhere (creating the folder, writing, renaming) removes the temporary file and
    is raised as an ``AccountingError`` naming ``path``."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=path.suffix)
    except OSError as err:
        raise write_error(path, err) from None
    os.close(fd)
    try:
        writer(tmp)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual permissions
        os.replace(tmp, path)
    except BaseException as err:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(err, OSError):
            raise write_error(path, err) from None
        raise
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json(path: Path, data: dict[str, Any]) -> Path:
    return write_atomic(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def write_table_files(stem: Path, tables: Sequence[Table], records: list[dict[str, Any]] | None = None) -> list[Path]:
    """``<stem>.md`` and ``<stem>.csv`` for a list of tables (CSV from ``records`` when given)."""
    csv_text = render_records_csv(records) if records is not None else render_csv(tables)
    return [
        write_atomic(stem.with_suffix(".md"), render_markdown(tables)),
        write_atomic(stem.with_suffix(".csv"), csv_text),
    ]


# ----------------------------------------------------------------- names -> file names
_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]")
SAFE_NAME = r"[A-Za-z0-9_+-][A-Za-z0-9._+-]*"
"""A regex for what ``safe_filename`` returns (for recognising our own files)."""


def safe_filename(name: str, max_len: int = 80) -> str:
    """A file-name component made from ``name`` (a model name), safe to join under an output folder.

    Letters, digits, ``.``, ``_``, ``+`` and ``-`` are kept; any other character (path separators,
    NUL, control characters, spaces, non-ASCII) becomes ``_``; ``..`` becomes ``_`` and a leading
    dot is dropped, so the result is never ``.``/``..``, never hidden and never leaves the folder.
    When anything was changed (or cut to ``max_len``), 8 hex digits of the name's SHA-256 are
    appended, so two different names never share a file (``a/b`` -> ``a_b-…``, ``a_b`` stays).
    ``gpt2-xl`` is returned unchanged."""
    if not isinstance(name, str):
        raise AccountingError(f"a file name must come from a string, got {type(name).__name__}")
    safe = _UNSAFE.sub("_", name)
    while ".." in safe:
        safe = safe.replace("..", "_")
    safe = safe.lstrip(".")
    if safe != name or len(safe) > max_len or not safe:
        digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
        safe = f"{safe[: max_len - 9]}-{digest}" if safe else digest
    return safe


# ----------------------------------------------------------------- whole output sets
_RENAME_EXCHANGE = 2  # linux/fs.h


def _exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths in one atomic step (Linux ``renameat2(RENAME_EXCHANGE)``).

    Returns False where the system does not offer it (then the caller renames twice)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_fdcwd = -100
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def _side_name(target: Path, kind: str) -> str:
    return f".{target.name}.{kind}-{os.getpid()}-{secrets.token_hex(4)}"


def _stale_side_dirs(target: Path) -> tuple[list[Path], list[Path]]:
    """Temp (``tmp``) and moved-aside (``old``) directories of ``target`` left by dead processes."""
    pattern = re.compile(re.escape(f".{target.name}.") + r"(tmp|old)-(\d+)-[0-9a-f]+")
    tmp, old = [], []
    with contextlib.suppress(OSError):
        for entry in target.parent.iterdir():
            match = pattern.fullmatch(entry.name)
            if match and not _pid_alive(int(match[2])):
                (tmp if match[1] == "tmp" else old).append(entry)
    return tmp, old


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


MAX_OWNED_ENTRIES = 10_000
"""An existing output folder with more entries than this is not one of ours (an output set has ~60)."""

MARKER = ".lm-account.json"
"""Written at the top of every output set (``atomic_dir``): a non-empty folder without it was not written by
lm-account and is never replaced, whatever its files are called (a user's own ``sweep.md``)."""
MARKER_TEXT = '{"written_by": "lm-account", "note": "an output set: the next run with this --out replaces it"}\n'

NAME_MAX, PATH_MAX = 255, 4096
"""Linux's limits: bytes in one path component (``NAME_MAX``), in a whole path with its NUL (``PATH_MAX``)."""
SIDE_EXTRA = 32
"""Bytes the temporary and lock entries beside an output folder add to its name (``.NAME.tmp-PID-HEX8``)."""


def _short(path: Path | str) -> str:
    text = str(path)
    return text if len(text) <= 80 else text[:40] + "…" + text[-30:]


def check_path_names(target: Path | str, extra: int = SIDE_EXTRA) -> None:
    """Refuse a path the file system cannot hold before anything is written: a component over ``NAME_MAX``
    bytes, a last component that leaves no room for the ``extra`` bytes of the entries made beside it, or a
    whole path over ``PATH_MAX``."""
    raw = os.fsencode(os.path.abspath(target))
    if len(raw) + extra >= PATH_MAX:
        raise AccountingError(f"{_short(target)}: the path is {len(raw):,} bytes, over the {PATH_MAX:,}-byte limit")
    parts = raw.split(b"/")
    for part in parts:
        if len(part) > NAME_MAX:
            raise AccountingError(
                f"{_short(target)}: a folder or file name of {len(part):,} bytes is over the file system's "
                f"{NAME_MAX}-byte limit; choose a shorter name"
            )
    if len(parts[-1]) + extra > NAME_MAX:
        raise AccountingError(
            f"{_short(target)}: the name is {len(parts[-1]):,} bytes; with the {extra} bytes of the temporary "
            f"entries written beside it that is over the {NAME_MAX}-byte limit; choose a shorter name"
        )


def check_no_dangling_links(target: Path | str) -> None:
    """Refuse a path with a symbolic link that leads nowhere (a missing target, a loop): following it would
    create the link's target's folders wherever it points, outside the folder asked for."""
    path = Path(os.path.abspath(target))
    for prefix in [*reversed(path.parents), path]:
        if os.path.islink(prefix) and not os.path.exists(prefix):
            raise AccountingError(
                f"{_short(target)}: {_short(prefix)} is a symbolic link to a missing {_short(os.readlink(prefix))}; "
                "refusing to create folders through it: give a real folder, or create the link's target first"
            )


def foreign_file(target: Path, owns: Callable[[str], bool]) -> str | None:
    """The first file under ``target`` (relative POSIX path) that ``owns`` does not recognise, or None.
    The set's ``MARKER`` at the top is its own."""
    seen = 0
    for root, dirs, files in os.walk(target, followlinks=False):
        dirs.sort()
        for name in sorted(files) + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            seen += 1
            rel = Path(root, name).relative_to(target).as_posix()
            if seen > MAX_OWNED_ENTRIES or not (owns(rel) or rel == MARKER):
                return rel
    return None


def _adoptable(path: Path, shown: Path | str, owns: Callable[[str], bool]) -> None:
    """Refuse to replace an existing folder unless lm-account wrote it: empty, or with the ``MARKER`` (a regular
    file) and every other file one that ``owns`` recognises."""
    marker = path / MARKER
    try:
        with os.scandir(path) as entries:
            first = min((e.name for e in entries), default=None)  # at most MAX_OWNED_ENTRIES (foreign_file)
        marked = marker.is_file() and not marker.is_symlink()
        rel = None if first is None else foreign_file(path, owns)
    except OSError as err:
        raise AccountingError(f"cannot read {shown}: {_why(err)}") from None
    if rel is not None:
        raise AccountingError(
            f"refusing to replace {shown}: it holds files lm-account did not write (e.g. {rel}); "
            "choose an empty or new --out folder"
        )
    if first is not None and not marked:
        raise AccountingError(
            f"refusing to replace {shown}: it holds files lm-account did not write (e.g. {first}: the folder has "
            f"no {MARKER}, which every output set of lm-account carries); choose an empty or new --out folder"
        )


def check_output_dir(target: Path | str, owns: Callable[[str], bool] | None = None) -> Path:
    """Refuse an output folder we must not replace, before any work is done; returns its absolute path.

    ``target`` may be missing, or an existing directory whose every file ``owns`` recognises as a
    file of our output set (an empty directory qualifies).  A file, or a directory holding anything
    else (a user's files, the repository root, ``reports/`` for a sweep), is an ``AccountingError``."""
    if not isinstance(target, (str, os.PathLike)):
        raise AccountingError(f"output folder must be a path, got {type(target).__name__}")
    if not str(target).strip():
        raise AccountingError("the output folder is empty: give one, e.g. --out results/ (the current folder is ./)")
    try:
        check_path_names(target)
        check_no_dangling_links(target)
        path = Path(os.path.realpath(target))
        check_path_names(path)
        if path.parent == path:
            raise AccountingError(f"{target}: refusing to write an output set at the root of the file system")
        if os.path.lexists(path) and not path.is_dir():
            raise AccountingError(f"cannot write {target}: exists and is not a directory")
        for parent in path.parents:
            if os.path.lexists(parent):
                if not parent.is_dir():
                    raise AccountingError(f"cannot write {target}: {parent} is not a directory")
                break
        is_dir = path.is_dir()
    except AccountingError:
        raise
    except (OSError, ValueError) as err:
        raise AccountingError(f"{_short(target)}: not a usable output folder: {_why(err)}") from None
    if is_dir and owns is not None:
        _adoptable(path, target, owns)
    return path


def check_output_stem(stem: str) -> None:
    """Refuse, before any work, a ``PATH_STEM`` for ``STEM.png``/``STEM.svg`` that cannot be written: an
    empty name, a name ending in a separator, a folder in its path that is a file, or a file name taken
    by a directory (``check_output_dir`` checks the folder)."""
    if not stem.strip() or stem.endswith(("/", os.sep)):
        raise AccountingError(
            f"plot path '{stem[:60]}': give a file name stem, e.g. plots/memory (writes .png and .svg)"
        )
    path = Path(stem)
    check_path_names(stem, extra=len(".") + len(".XXXXXXXX.png"))  # mkstemp's ".STEM.XXXXXXXX.png" beside it
    check_output_dir(path.parent if str(path.parent) else ".")
    for ext in ("png", "svg"):
        if os.path.isdir(f"{stem}.{ext}"):
            raise AccountingError(f"cannot write {stem}.{ext}: it is a directory")


@contextlib.contextmanager
def _lock(target: Path, shown: Path | str) -> Iterator[None]:
    """An exclusive, non-blocking ``flock`` on ``.<name>.lock`` beside ``target``; removed on exit."""
    import fcntl

    lock_path = target.parent / f".{target.name}.lock"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
    except OSError as err:
        raise write_error(shown, err) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            # The holder before us may have removed the lock file after we opened it: then our lock
            # is on a dead inode and a third writer could lock the new file.  Treat it as held.
            if os.stat(lock_path).st_ino != os.fstat(fd).st_ino:
                raise BlockingIOError
        except (BlockingIOError, FileNotFoundError):
            raise AccountingError(
                f"{shown} is being written by another lm-account run (lock {lock_path} is held); "
                "wait for it to finish or choose another --out"
            ) from None
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                os.unlink(lock_path)  # still holding the lock, so no other writer is between
    finally:
        os.close(fd)


class Terminated(BaseException):
    """SIGTERM arrived while an output set was being written (cleaned up, then exit 143)."""


@contextlib.contextmanager
def _sigterm_cleans_up() -> Iterator[None]:
    """Turn SIGTERM into an exception while writing, so ``atomic_dir`` removes its temporary folder
    (``timeout`` and most process managers send SIGTERM).  Main thread only; SIGKILL cannot be caught."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Terminated

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    except Terminated:
        raise SystemExit(128 + signal.SIGTERM) from None
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def atomic_dir(
    target: Path | str, owns: Callable[[str], bool] | None = None, keep: Callable[[str], bool] | None = None
) -> Iterator[Path]:
    """Build an output set in a temporary directory and swap it in for ``target`` at the end.

    Usage::

        with atomic_dir(out, owns=is_report_file) as tmp:
            write_atomic(tmp / "a.md", ...)     # write the whole set under tmp

    - Only ``target`` is replaced; besides it, the run creates (and removes) two entries in its
      parent: the lock file ``.<name>.lock`` and the temporary ``.<name>.tmp-<pid>-<hex>``.
    - ``check_output_dir(target, owns)`` runs first: a directory with files we did not write
      is never replaced.
    - An exclusive non-blocking ``flock`` on the lock file makes a second writer to the same
      target fail at once with an ``AccountingError`` (exit 2), so two runs never mix files.
    - Temporary and moved-aside directories left by dead processes (the pid in the name is not
      running) are removed first; if a run died between the two renames of the fallback swap
      (below), the moved-aside old set is restored first.
    - The swap: on Linux ``renameat2(RENAME_EXCHANGE)`` exchanges the two directories in one
      atomic step, so ``target`` always exists, holding the old or the new set.  Elsewhere the
      old set is renamed to ``.<name>.old-<pid>-<hex>`` and the new one renamed in: two
      ``rename`` calls, the only window in which ``target`` is missing.  The old set is then deleted.
    - ``keep(rel)``: files of the old set that this run did not write but should carry over
      (e.g. the figures of a ``--no-plots`` run) are copied into the new set before the swap.
    - On any exception (including Ctrl-C, and SIGTERM, which exits 143) the temporary directory
      and the lock file are removed and ``target`` is untouched.  A SIGKILL leaves ``target`` untouched and the temporary directory behind, for
      the next run to remove.
    """
    shown = target
    path = check_output_dir(target, owns)
    with _sigterm_cleans_up(), _lock(path, shown):
        stale_tmp, stale_old = _stale_side_dirs(path)
        if stale_old and not os.path.lexists(path):
            newest = max(stale_old, key=lambda p: p.stat().st_mtime)
            with contextlib.suppress(OSError):
                os.rename(newest, path)
        for leftover in stale_tmp + stale_old:
            if os.path.lexists(leftover):
                _remove(leftover)
        path = check_output_dir(path, owns)  # again, now that the lock is held
        tmp = path.parent / _side_name(path, "tmp")
        try:
            os.mkdir(tmp)
        except OSError as err:
            raise write_error(shown, err) from None
        try:
            (tmp / MARKER).write_text(MARKER_TEXT)
            yield tmp
            if keep is not None and path.is_dir():
                _carry_over(path, tmp, keep)
            _swap_in(tmp, path)
        except OSError as err:
            _remove(tmp)
            raise write_error(shown, err) from None
        except BaseException:
            _remove(tmp)
            raise


def _carry_over(old: Path, new: Path, keep: Callable[[str], bool]) -> None:
    for root, _dirs, files in os.walk(old, followlinks=False):
        for name in files:
            src = Path(root, name)
            rel = src.relative_to(old)
            dst = new / rel
            if keep(rel.as_posix()) and not dst.exists() and not src.is_symlink():
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dst)


def _swap_in(tmp: Path, target: Path) -> None:
    if not os.path.lexists(target):
        os.rename(tmp, target)
        return
    if _exchange(tmp, target):
        _remove(tmp)  # now holds the old set
        return
    aside = target.parent / _side_name(target, "old")
    os.rename(target, aside)
    try:
        os.rename(tmp, target)  # the window: between these two renames target is missing
    except BaseException:
        os.rename(aside, target)
        raise
    _remove(aside)
