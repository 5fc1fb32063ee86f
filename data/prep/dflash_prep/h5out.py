"""Streams sequences into the HDF5 layout dflash_mpi reads (data/README.md, "Format"; lib/io/dataset.h):
  tokens    int32 [total]   every sequence's token ids, concatenated
  offsets   int64 [n + 1]   sequence i is tokens[offsets[i] : offsets[i+1]]; offsets[0] = 0
  loss_mask uint8 [total]   1 = trained on
Same storage as the C++ DatasetWriter: extendible 1-D datasets, chunks of 16 Ki elements, deflate level 4.
The reader requires no attributes. The caller writes to a partial name (atomic.atomic_output)."""
import h5py
import numpy as np

CHUNK = 1 << 14
FLUSH_TOKENS = 1 << 20   # buffered tokens before a write to the file


class DatasetWriter:
    def __init__(self, path: str):
        self.f = h5py.File(path, "w")
        kw = dict(shape=(0,), maxshape=(None,), chunks=(CHUNK,), compression="gzip", compression_opts=4)
        self.ds = {"tokens": self.f.create_dataset("tokens", dtype="<i4", **kw),
                   "offsets": self.f.create_dataset("offsets", dtype="<i8", **kw),
                   "loss_mask": self.f.create_dataset("loss_mask", dtype="u1", **kw)}
        self.buf_tokens, self.buf_mask, self.buf_offsets = [], [], [np.zeros(1, np.int64)]
        self.total = 0          # tokens added so far
        self.sequences = 0
        self.buffered = 0

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

    def close(self):
        self._flush()
        self.f.close()
