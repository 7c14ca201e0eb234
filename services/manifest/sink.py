"""A write-once file sink for large outputs: hashes the bytes as they pass and writes them with
O_DIRECT, so a 1 GB manifest neither evicts the node's page cache nor pays for filling it.

The Arrow IPC writer calls `write` with its buffers; they are copied into a small ring of
page-aligned blocks (allocated once, reused). A full block goes to two single-thread workers:
one updates the sha256 (blocks in order), the other `pwrite`s it at its offset, so hashing and
the disk overlap each other and the caller. The last partial block is written zero-padded to the
alignment and the file is then truncated to its real length. Where the filesystem refuses
O_DIRECT (tmpfs), the same code runs on a normal descriptor.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import mmap
import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import TracebackType

ALIGN = 4096  # O_DIRECT alignment of offsets, lengths and memory (a page covers every device)
BLOCK = 8 << 20
RING = 4


def _open(path: Path) -> tuple[int, bool]:
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
    direct = getattr(os, "O_DIRECT", 0)
    if direct:
        try:
            return os.open(path, flags | direct, 0o644), True
        except OSError:
            pass  # EINVAL: the filesystem has no direct I/O
    return os.open(path, flags, 0o644), False


class HashingDirectSink:
    """File-like object for `pyarrow.PythonFile(sink, mode="w")`; `sha256()` after `close()`."""

    def __init__(self, path: Path, block: int = BLOCK, ring: int = RING) -> None:
        if block % ALIGN:
            raise ValueError(f"block must be a multiple of {ALIGN}")
        self.path = path
        self.fd, self.direct = _open(path)
        self._blocks = [mmap.mmap(-1, block) for _ in range(ring)]  # page-aligned
        self._pending: list[list[Future[object]]] = [[] for _ in range(ring)]
        self._hash = hashlib.sha256()
        self._hasher = ThreadPoolExecutor(1, thread_name_prefix="sink-hash")
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="sink-write")
        self._current = 0
        self._fill = 0
        self._flushed = 0  # file offset of the current block
        self._digest: str | None = None
        self.closed = False

    # -- file protocol used by pyarrow ---------------------------------------------------
    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._flushed + self._fill

    def write(self, data: bytes | bytearray | memoryview) -> int:
        view = memoryview(data).cast("B")
        size = len(view)
        while view:
            block = self._blocks[self._current]
            take = min(len(view), len(block) - self._fill)
            block[self._fill : self._fill + take] = view[:take]
            self._fill += take
            view = view[take:]
            if self._fill == len(block):
                self._submit(len(block))
        return size

    def flush(self) -> None:
        """Blocks go out as they fill; the tail goes at close."""

    def close(self) -> None:
        if self.closed:
            return
        try:
            length = self.tell()
            if self._fill:
                self._submit(self._fill)
            for pending in self._pending:
                for future in pending:
                    future.result()
            os.ftruncate(self.fd, length)
            self._digest = self._hash.hexdigest()
        finally:
            self.closed = True
            self._hasher.shutdown()
            self._writer.shutdown()
            os.close(self.fd)
            for block in self._blocks:
                block.close()

    def __enter__(self) -> HashingDirectSink:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if kind is None:
            self.close()
        else:
            with contextlib.suppress(Exception):
                self.close()

    def sha256(self) -> str:
        if self._digest is None:
            raise RuntimeError("sha256() before close()")
        return self._digest

    # -- internals -----------------------------------------------------------------------
    def _submit(self, used: int) -> None:
        index, offset = self._current, self._flushed
        block = self._blocks[index]
        padded = -(-used // ALIGN) * ALIGN
        if padded != used:
            block[used:padded] = bytes(padded - used)
        self._pending[index] = [
            self._hasher.submit(self._update, index, used),
            self._writer.submit(self._pwrite, index, padded, offset),
        ]
        self._flushed += used
        self._current = (index + 1) % len(self._blocks)
        self._fill = 0
        for future in self._pending[self._current]:  # the next block must be free to refill
            future.result()
        self._pending[self._current] = []

    def _update(self, index: int, used: int) -> None:
        with memoryview(self._blocks[index]) as view:
            self._hash.update(view[:used])

    def _pwrite(self, index: int, length: int, offset: int) -> None:
        with memoryview(self._blocks[index]) as view:
            done = 0
            while done < length:
                try:
                    done += os.pwrite(self.fd, view[done:length], offset + done)
                except OSError as error:
                    # Some filesystems take O_DIRECT at open and refuse it on write.
                    if error.errno != errno.EINVAL or not self.direct:
                        raise
                    flags = fcntl.fcntl(self.fd, fcntl.F_GETFL)
                    fcntl.fcntl(self.fd, fcntl.F_SETFL, flags & ~os.O_DIRECT)
                    self.direct = False
