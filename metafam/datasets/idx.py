"""Reader and writer for the IDX format of (Fashion-)MNIST, plain or gzipped.

Layout: two zero bytes, a dtype code, the number of dimensions ``d``, ``d`` big-endian uint32 sizes, then the data in
row-major order, big-endian.
"""

from __future__ import annotations

import gzip

import numpy as np

from metafam.io import atomic_write

_CODES = {0x08: np.dtype(">u1"), 0x09: np.dtype(">i1"), 0x0B: np.dtype(">i2"), 0x0C: np.dtype(">i4"),
          0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}
_BY_KIND = {(np.dtype(v).kind, np.dtype(v).itemsize): k for k, v in _CODES.items()}


def read_idx(path: str) -> np.ndarray:
  """Reads an IDX file (gzipped or not, detected from its bytes) into a native-endian numpy array."""
  with open(path, "rb") as f:
    raw = f.read()
  if raw[:2] == b"\x1f\x8b":  # gzip magic, whatever the file is called
    raw = gzip.decompress(raw)
  if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _CODES:
    raise ValueError(f"{path}: not an IDX file (bad magic number {raw[:4].hex() or 'empty'}).")
  dtype, ndim = _CODES[raw[2]], raw[3]
  header = 4 + 4 * ndim
  shape = tuple(int(s) for s in np.frombuffer(raw[4:header], dtype=">u4")) if ndim else ()
  count = int(np.prod(shape, dtype=np.int64))
  if len(raw) - header != count * dtype.itemsize:
    raise ValueError(f"{path}: header says shape {shape} ({count * dtype.itemsize} data bytes) but the file holds "
                     f"{len(raw) - header} data bytes.")
  data = np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)
  return data.astype(dtype.newbyteorder("="))


def write_idx(path: str, array: np.ndarray) -> None:
  """Writes ``array`` as IDX (gzipped when ``path`` ends in ``.gz``), atomically."""
  array = np.asarray(array)
  code = _BY_KIND.get((array.dtype.kind, array.dtype.itemsize))
  if code is None:
    raise ValueError(f"IDX cannot store dtype {array.dtype}; use uint8, int8, int16, int32, float32 or float64.")
  header = bytes([0, 0, code, array.ndim]) + np.asarray(array.shape, dtype=">u4").tobytes()
  data = header + array.astype(_CODES[code]).tobytes()
  if str(path).endswith(".gz"):
    data = gzip.compress(data, mtime=0)
  atomic_write(path, data)
