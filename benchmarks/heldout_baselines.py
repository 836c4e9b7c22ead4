"""Regenerates the heldout suite's tuned baselines (metafam/benchmark/data/heldout_baselines.json).

    python benchmarks/heldout_baselines.py --shard_dir heldout_shards [--tasks a,b] [--collect_only]

Each (task, optimizer) is one JSON shard under --shard_dir, written atomically; rerunning skips existing shards, so
an interrupted run resumes. After the shards, the data file is rewritten from every task whose shards are complete
(the others are listed as pending). See `metafam.benchmark.baselines` for the procedure.
"""

from __future__ import annotations

import argparse
import time

from metafam.benchmark import baselines


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--shard_dir", default="heldout_shards")
  parser.add_argument("--tasks", default="", help="comma-separated heldout task names (default: all)")
  parser.add_argument("--collect_only", action="store_true", help="only rebuild the data file from the shards")
  parser.add_argument("--out", default=baselines.DATA_FILE, help="the data file to write (default: the shipped one)")
  args = parser.parse_args()
  start = time.perf_counter()
  if not args.collect_only:
    baselines.generate(args.shard_dir, [t for t in args.tasks.split(",") if t] or None)
  data = baselines.collect(args.shard_dir, args.out)
  print(f"{len(data['tasks'])} tasks complete, {len(data['pending'])} pending; "
        f"{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
  main()
