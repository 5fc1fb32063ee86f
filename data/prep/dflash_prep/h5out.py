"""Streams sequences into the HDF5 layout dflash_mpi reads (data/README.md, "Format"; lib/io/dataset.h):
  tokens    int32 [total]   every sequence's token ids, concatenated
  offsets   int64 [n + 1]   sequence i is tokens[offsets[i] : offsets[i+1]]; offsets[0] = 0
  loss_mask uint8 [total]   1 = trained on
Same storage as the C++ DatasetWriter: extendible 1-D datasets, chunks of 16 Ki elements, deflate level 4.
The reader requires no attributes. The caller writes to a partial name (atomic.atomic_output).

Write errors: HDF5 cannot recover from a failed write (a full disk, ulimit -f): its file stays open with dirty
metadata, and the library crashes (SIGSEGV) when it tries to flush it again at exit. So HDF5 writes through a
Python file object (h5py's 'fileobj' driver, as fast here) that remembers the first OSError and from then on
discards the data, which lets HDF5 close the file normally; the writer then raises OutputError with that error.
"""
import contextlib
import io

import h5py
import numpy as np

from .atomic import OutputError

CHUNK = 1 << 14
FLUSH_TOKENS = 1 << 20   # buffered tokens before a write to the file


class _FailSafeFile(io.RawIOBase):
    """A binary file for h5py: after the first failed write every write and truncate succeeds without effect and
    reads return zeros; `error` holds that first OSError."""

    def __init__(self, path: str):
        super().__init__()
        self.f = open(path, "w+b", buffering=0)   # unbuffered: a write fails in write(), never later in a seek
        self.error = None

    def readable(self):
        return True

    def writable(self):
        return True

    def seekable(self):
        return True

    def _guard(self, op, fallback):
        if self.error is None:
            try:
                return op()
            except OSError as e:
                self.error = e
        return fallback

    def readinto(self, b):
        if self.error is not None:
            b[:] = bytes(len(b))
            return len(b)
        return self.f.readinto(b)

    def write(self, b):
        return self._guard(lambda: self.f.write(b), len(b))

    def seek(self, pos, whence=0):
        return self.f.seek(pos, whence)

    def tell(self):
        return self.f.tell()

    def truncate(self, size=None):
        return self._guard(lambda: self.f.truncate(size), size)

    def flush(self):
        if not self.f.closed:   # IOBase.close() flushes again after close() below closed self.f
            self._guard(self.f.flush, None)

    def close(self):
        if not self.f.closed:
            self.flush()
            self._guard(self.f.close, None)
            with contextlib.suppress(OSError):
                self.f.close()   # after a failed close: only releases the descriptor
        super().close()


class DatasetWriter:
    def __init__(self, path: str, name: str = None):
        """path: the file to write (the partial name); name: the file to name in errors (the final path)."""
        self.name = name or path
        self.sink = _FailSafeFile(path)
        self.f = h5py.File(self.sink, "w")
        kw = dict(shape=(0,), maxshape=(None,), chunks=(CHUNK,), compression="gzip", compression_opts=4)
        self.ds = {"tokens": self.f.create_dataset("tokens", dtype="<i4", **kw),
                   "offsets": self.f.create_dataset("offsets", dtype="<i8", **kw),
                   "loss_mask": self.f.create_dataset("loss_mask", dtype="u1", **kw)}
        self.buf_tokens, self.buf_mask, self.buf_offsets = [], [], [np.zeros(1, np.int64)]
        self.total = 0          # tokens added so far
        self.sequences = 0
        self.buffered = 0
        self.closed = False

    def add(self, tokens: np.ndarray, loss_mask: np.ndarray):
        assert len(tokens) == len(loss_mask)
        self.buf_tokens.append(np.asarray(tokens, np.int32))
        self.buf_mask.append(np.asarray(loss_mask, np.uint8))
        self.total += len(tokens)
        self.sequences += 1
        self.buf_offsets.append(np.array([self.total], np.int64))
        self.buffered += len(tokens)
        if self.buffered >= FLUSH_TOKENS:
            self._flush()
            self._raise_if_failed()   # stop at the first failed write, not after reading all the input

    def _append(self, name: str, parts: list):
        if not parts:
            return
        data = np.concatenate(parts)
        ds = self.ds[name]
        n = ds.shape[0]
        ds.resize((n + len(data),))
        ds[n:] = data

    def _flush(self):
        self._append("tokens", self.buf_tokens)
        self._append("loss_mask", self.buf_mask)
        self._append("offsets", self.buf_offsets)
        self.buf_tokens, self.buf_mask, self.buf_offsets = [], [], []
        self.buffered = 0

    def _raise_if_failed(self):
        if self.sink.error is not None:
            self.close()   # raises OutputError

    def close(self):
        """Writes what is buffered and closes the file; raises OutputError when a write failed. Safe to call again
        (e.g. from a finally block after an error)."""
        if self.closed:
            return
        self.closed = True
        try:
            if self.sink.error is None:
                self._flush()
        finally:
            try:
                self.f.close()
            except OSError as e:   # HDF5's own error text; the sink's first error, when there is one, is clearer
                if self.sink.error is None:
                    self.sink.error = e
            self.sink.close()
        if self.sink.error is not None:
            raise OutputError(self.name, self.sink.error)
