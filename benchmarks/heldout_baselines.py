"""Regenerates a suite's tuned baselines (metafam/benchmark/data/<suite>_baselines.json).

    python benchmarks/heldout_baselines.py --shard_dir heldout_shards [--tasks a,b] [--collect_only]
    python benchmarks/heldout_baselines.py --suite test --shard_dir test_shards
    python benchmarks/heldout_baselines.py --suite test --shard_dir test_shards --tasks a --shards muon  # one shard

Each (task, optimizer) is one JSON shard under --shard_dir, written atomically; rerunning skips existing shards, so
an interrupted run resumes. After the shards, the data file is rewritten from every task whose shards are complete
(the others are listed as pending). See `metafam.benchmark.baselines` for the procedure.
"""

from __future__ import annotations

import argparse
import time

from metafam.benchmark import baseline_files


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--suite", default="heldout", choices=sorted(baseline_files.SUITE_SPECS),
                      help="the suite whose baselines are generated")
  parser.add_argument("--shard_dir", default=None, help="where the shards go (default <suite>_shards)")
  parser.add_argument("--tasks", default="", help="comma-separated task names of the suite (default: all)")
  parser.add_argument("--shards", default="",
                      help="comma-separated shards to compute (of the suite's optimizers and adam_reference; "
                           "default: all), so separate processes can share a task")
  parser.add_argument("--collect_only", action="store_true", help="only rebuild the data file from the shards")
  parser.add_argument("--out", default=None, help="the data file to write (default: the suite's shipped one)")
  args = parser.parse_args()
  start = time.perf_counter()
  shard_dir = args.shard_dir or f"{args.suite}_shards"
  if not args.collect_only:
    try:
      baseline_files.generate(shard_dir, [t for t in args.tasks.split(",") if t] or None, suite=args.suite,
                              shards=[o for o in args.shards.split(",") if o] or None)
    except ValueError as e:
      parser.error(str(e))
  data = baseline_files.collect(shard_dir, args.out, suite=args.suite)
  print(f"{len(data['tasks'])} tasks complete, {len(data['pending'])} pending; "
        f"{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
  main()
