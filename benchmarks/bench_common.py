"""What the benchmark scripts share: the ``--smoke`` and ``--markdown`` flags, the 8x8 image-MLP workload, the
round-robin timer, and the Markdown table a run writes (device, JAX version and date in its heading, written atomically).

``--smoke`` shrinks a benchmark's workload to a few lanes and steps so that every code path of the script runs in
seconds (the test suite runs each benchmark this way, tests/project/test_scripts.py); its numbers mean nothing.
"""

from __future__ import annotations

import datetime
import os
import statistics
import time

import jax

from metafam.io import atomic_write


def add_flags(parser, markdown=True):
  """Adds ``--smoke`` (and ``--markdown PATH``) to an argparse parser."""
  parser.add_argument("--smoke", action="store_true",
                      help="a tiny workload, one round: runs every code path in seconds; the numbers mean nothing")
  if markdown:
    parser.add_argument("--markdown", metavar="PATH", help="also write the results as a Markdown table to PATH")


def round_robin(runs, rounds):
  """Median seconds per call of each blocking ``run`` (each warmed up once), called in turn ``rounds`` times, so
  machine-speed drift hits every run alike."""
  for run in runs.values():
    run()
  times = {name: [] for name in runs}
  for _ in range(rounds):
    for name, run in runs.items():
      start = time.perf_counter()
      run()
      times[name].append(time.perf_counter() - start)
  return {name: statistics.median(t) for name, t in times.items()}


def image_mlp_family(smoke=False):
  """The benchmarks' workload: the 8x8 image-MLP family (64 -> 32 ReLU -> 10, batch 128, no label noise); with
  ``smoke``, 4 hidden units and batches of 8."""
  from metafam.taskfamilies.image_mlp import ImageMLPFamily  # pylint: disable=import-outside-toplevel
  return ImageMLPFamily((4,) if smoke else (32,), image_size=8, batch_size=8 if smoke else 128,
                        activations=("relu",), label_noise_range=(0.0, 0.0))


def environment() -> str:
  """One line naming the device, the JAX version and the date (UTC): the heading of every table a run writes."""
  device = jax.devices()[0]
  kind = device.device_kind if device.platform != "cpu" else f"CPU ({os.cpu_count()} cores visible)"
  date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
  return f"{len(jax.devices())} x {kind}, JAX {jax.__version__}, {date}"


def markdown_table(title, columns, rows, notes=()):
  """A Markdown section: ``## title``, the environment line, a table of ``rows`` (sequences of cells: strings are
  kept, numbers formatted to 3 significant digits), then ``notes`` as paragraphs."""
  def cell(value):
    if isinstance(value, str):
      return value
    if isinstance(value, int):
      return f"{value:,}"
    return f"{value:,.3g}" if abs(value) < 1e3 else f"{value:,.0f}"

  lines = [f"## {title}", "", environment(), "", "| " + " | ".join(columns) + " |",
           "|" + "---|" * len(columns)]
  lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
  lines += [line for note in notes for line in ("", note)]
  return "\n".join(lines) + "\n"


def write_markdown(path, sections):
  """Writes the `markdown_table` sections to ``path`` atomically (`metafam.io.atomic_write`); nothing when ``path``
  is empty."""
  if not path:
    return
  atomic_write(path, "\n".join(sections).encode("utf-8"))
  print(f"wrote {path}")
