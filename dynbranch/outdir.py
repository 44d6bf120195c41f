"""Where result files go: a local directory or any pyarrow filesystem URI.

``--out`` takes a path (``runs/x``, ``/mnt/shared/x``) or a URI pyarrow resolves
(``file:///tmp/x``, ``s3://bucket/x``, ``gs://bucket/x``, ``hdfs://…``). Every file is
written atomically: its bytes go to a hidden temporary name beside it, which is then moved
onto the final name, so a reader (or a run killed mid-write) sees either the old file, the
new one, or none — never half of one. On a local filesystem the move is a rename; on object
stores an object appears whole when its upload completes, and the move is a server-side copy.
:meth:`OutDir.check` proves the destination writable before anything starts, and
:meth:`OutDir.claimed` keeps a second run from writing into a local directory a run is using.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dynbranch.errors import OutputError

if TYPE_CHECKING:
    from collections.abc import Iterator

    from pyarrow import NativeFile
    from pyarrow.fs import FileSystem


def _is_uri(out: str) -> bool:
    scheme, sep, _rest = out.partition("://")
    return bool(sep) and scheme.isalnum() and len(scheme) > 1  # NOTE: not a Windows drive


@dataclass(frozen=True)
class OutDir:
    """A result directory: ``fs`` (a pyarrow filesystem) and ``path`` inside it.

    ``shown`` is how it was given (what messages and ``summary.json`` say).
    """

    fs: FileSystem
    path: str
    shown: str

    @classmethod
    def parse(cls, out: str | Path | OutDir) -> OutDir:
        """The destination ``out`` names (a typed :class:`OutputError` when pyarrow cannot
        resolve its URI: an unknown scheme, a filesystem this pyarrow was built without)."""
        from pyarrow import ArrowException
        from pyarrow.fs import FileSystem, LocalFileSystem

        if isinstance(out, OutDir):
            return out
        text = str(out)
        if not _is_uri(text):
            return cls(LocalFileSystem(), str(Path(text).expanduser().resolve()), text)
        try:
            fs, path = FileSystem.from_uri(text)
        except (ArrowException, ValueError, OSError) as e:
            raise OutputError(text, f"not a filesystem pyarrow can open: {e}") from None
        return cls(fs, path.rstrip("/"), text.rstrip("/"))

    def __str__(self) -> str:
        return self.shown

    @property
    def local(self) -> Path | None:
        """The directory on this machine's filesystem, or ``None`` for a remote one."""
        from pyarrow.fs import LocalFileSystem

        return Path(self.path) if isinstance(self.fs, LocalFileSystem) else None

    def child(self, name: str) -> OutDir:
        """The subdirectory ``name``."""
        return OutDir(self.fs, f"{self.path}/{name}", f"{self.shown}/{name}")

    def file(self, name: str) -> str:
        """The full path of file ``name`` inside this directory (on :attr:`fs`)."""
        return f"{self.path}/{name}"

    def make(self) -> None:
        """Create the directory (and its parents) if it does not exist."""
        self.fs.create_dir(self.path, recursive=True)

    def write_bytes(self, name: str, data: bytes) -> None:
        """Write file ``name`` atomically (a temporary beside it, then a move onto it)."""
        with self.open_atomic(name) as f:
            f.write(data)

    @contextlib.contextmanager
    def open_atomic(self, name: str) -> Iterator[NativeFile]:
        """An output stream for file ``name``, written piece by piece and moved onto the
        name only when the block exits normally (on an exception the temporary goes)."""
        parent, _, base = name.rpartition("/")
        if parent:
            self.fs.create_dir(self.file(parent), recursive=True)
        tmp = self.file(f"{parent + '/' if parent else ''}.{base}.tmp-{uuid.uuid4().hex[:8]}")
        try:
            with self.fs.open_output_stream(tmp) as f:
                yield f
            self.fs.move(tmp, self.file(name))
        except BaseException:
            with contextlib.suppress(Exception):
                self.fs.delete_file(tmp)
            raise

    def write_text(self, name: str, text: str) -> None:
        """Write text file ``name`` (UTF-8) atomically."""
        self.write_bytes(name, text.encode("utf-8"))

    def read_bytes(self, name: str) -> bytes:
        """The bytes of file ``name``."""
        with self.fs.open_input_stream(self.file(name)) as f:
            return f.read()

    def exists(self, name: str) -> bool:
        """Whether file ``name`` exists here."""
        from pyarrow.fs import FileType

        return self.fs.get_file_info(self.file(name)).type == FileType.File

    def listdir(self, sub: str = "") -> list[str]:
        """Names of the files directly in ``sub`` (sorted; empty when it does not exist)."""
        from pyarrow.fs import FileSelector, FileType

        base = self.file(sub) if sub else self.path
        infos = self.fs.get_file_info(FileSelector(base, allow_not_found=True))
        return sorted(i.base_name for i in infos if i.type == FileType.File)

    def listdir_dirs(self) -> list[str]:
        """Names of the subdirectories directly in this directory (sorted)."""
        from pyarrow.fs import FileSelector, FileType

        infos = self.fs.get_file_info(FileSelector(self.path, allow_not_found=True))
        return sorted(i.base_name for i in infos if i.type == FileType.Directory)

    def remove_tree(self, sub: str) -> None:
        """Delete the subdirectory ``sub`` and everything in it (nothing if absent)."""
        with contextlib.suppress(FileNotFoundError):
            self.fs.delete_dir(self.file(sub))

    def check(self) -> None:
        """Prove the destination writable now: create it, write and remove a probe file.

        Raises :class:`OutputError` naming the destination and the problem.
        """
        probe = f".dynbranch-probe-{uuid.uuid4().hex[:8]}"
        try:
            self.make()
            self.write_bytes(probe, b"probe")
            self.fs.delete_file(self.file(probe))
        except OutputError:
            raise
        except Exception as e:  # NOTE: pyarrow raises OSError subclasses and ArrowException
            raise OutputError(self.shown, f"not writable: {type(e).__name__}: {e}") from None

    @contextlib.contextmanager
    def claimed(self) -> Iterator[None]:
        """Hold this destination for one run: a second run that claims it meanwhile gets an
        :class:`OutputError` naming the holder, instead of mixing its rows into this run's.

        NOTE: an exclusive ``flock`` on :data:`LOCK_FILE`, so the claim ends with the process
        however it ends (a SIGKILL leaves the file, not the lock). Only a directory on this
        machine's filesystem can be claimed: pyarrow's object stores have no exclusive create,
        so a URI destination is not claimed (two runs must not share one).
        """
        local = self.local
        if local is None:
            yield
            return
        import fcntl

        self.make()
        path = local / LOCK_FILE
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(fd)
                os.close(fd)
                raise OutputError(self.shown, f"another run is writing here ({holder}); wait "
                                  "for it to end or choose another --out") from None
            try:
                same = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # the holder released and removed it between our open and lock
        try:
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode())
            yield
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            os.close(fd)  # NOTE: unlinked while still locked, so no one locks the old file


LOCK_FILE = ".dynbranch-run.lock"
"""The file a running replay holds locked in its local result directory."""


def _read_holder(fd: int) -> str:
    """Who holds a claim, from its lock file ("pid 123 on host")."""
    try:
        holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return f"pid {holder['pid']} on {holder['host']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that has not written its name yet"

