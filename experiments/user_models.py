"""Optimizers on models a user writes in plain JAX (no metafam `Task`), used only through optax.

    python experiments/user_models.py --markdown user_models.md            # every model, ~1-2 CPU-hours
    python experiments/user_models.py --models mlp_256x256 logreg --optimizers adam muon generalist_v1

Issue 39's second yardstick: a shipped learned optimizer must not be slower than tuned Muon on models it never saw,
written the way a user writes them. The models (`MODELS`) are plain ``init`` / ``apply`` functions on the full
Fashion-MNIST at 28x28 (50,000 training images, 10,000 for choosing the rate, 10,000 test images; read from
``--data_dir``, ``$METAFAM_FASHION_MNIST_DIR`` or Debian's ``dataset-fashion-mnist``), softmax cross-entropy, batches
of 128 drawn with replacement, ``--steps`` steps (1,000). The training loop is one jitted `lax.scan` with the data
on the device; every optimizer is an optax transformation: ``optax.adam``, ``optax.contrib.muon``, or a shipped
learned optimizer through `metafam.pretrained.optax_transform` (the only metafam call on the model's side).

Every optimizer's learning rate is tuned on the same 7-point grid (3.2e-4 to 0.32, half a decade apart; constant
rate, as a user's first sweep), one seed per rate, chosen by the final loss on the 10,000 held-out training images;
the chosen rate then runs a second seed. Reported per (model, optimizer), on the test images (every ``--eval_every``
steps, averaged over the two seeds): the final and the best test loss, and the **speedup** over tuned Adam = the
steps tuned Adam needs to reach the optimizer's best test loss / the steps the optimizer needed (tuned Adam runs
4x the horizon for this; "> x" when it never gets there, x being its 4x horizon over the optimizer's steps). A rate
at an end of the grid is marked ``*``.

With ``--json PATH`` each finished (model, optimizer) is written at once, and the same command again resumes
from the file (a file of other settings is refused).

``--candidate THETA...`` adds learned optimizers that are not shipped: theta files written by
``experiments/export_pretrained.py --candidate`` (e.g. a generalist_v2 candidate), each built from the optimizer and
the recipe's ``optimizer_kwargs`` its header names, its step ``learning_rate * u`` (``step_mult`` 1, then scaled),
its rate tuned like the others'. Its row is named after the file.

``--smoke`` runs every code path in seconds on the embedded 8,000-image slice (models ``logreg`` and ``mlp_16x16``,
20 steps, two rates); its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from metafam import pretrained
from metafam.datasets import images as image_data

GRID = tuple(float(10.0 ** e) for e in np.arange(-3.5, -0.4, 0.5))  # 3.2e-4 ... 0.32, 7 points
REFERENCE = "adam"
REFERENCE_FACTOR = 4


# -- models: plain JAX ------------------------------------------------------------------------------------------
def mlp(widths, activation=jax.nn.relu):
  """``init(key) -> [(w, b), ...]`` and ``apply(params, x [B, 784]) -> logits [B, 10]``; LeCun-normal weights."""
  sizes = [784, *widths, 10]

  def init(key):
    keys = jax.random.split(key, len(sizes) - 1)
    return [(jax.random.normal(k, (a, b)) / np.sqrt(a), jnp.zeros((b,))) for k, a, b in zip(keys, sizes, sizes[1:])]

  def apply(params, x):
    for i, (w, b) in enumerate(params):
      x = x @ w + b
      if i < len(params) - 1:
        x = activation(x)
    return x
  return init, apply


MODELS = {
    "logreg": lambda: mlp([]),  # convex
    "mlp_256x256": lambda: mlp([256, 256]),
    "mlp_192x192x192_gelu": lambda: mlp([192, 192, 192], jax.nn.gelu),
    "mlp_tanh_10x64": lambda: mlp([64] * 10, jnp.tanh),  # deep and narrow
}
SMOKE_MODELS = {"logreg": lambda: mlp([]), "mlp_16x16": lambda: mlp([16, 16])}


def optimizer_factory(name: str, num_steps: int, candidates=None):
  """``learning_rate -> optax transformation`` for ``name``: adam, muon, a shipped learned optimizer, or a key of
  ``candidates`` (``{name: theta file}``, see `candidate_factory`); ``num_steps``, the run's length, goes to a learned
  optimizer whose rule reads it (a learned schedule)."""
  if name in (candidates or {}):
    return candidate_factory(candidates[name], num_steps)
  if name == "adam":
    return optax.adam
  if name == "muon":
    return optax.contrib.muon
  return lambda learning_rate: pretrained.optax_transform(name, learning_rate, num_steps=num_steps)


def candidate_factory(path: str, num_steps: int):
  """``learning_rate -> optax transformation`` of a theta file of `experiments/export_pretrained.py --candidate`:
  the learned optimizer its header names, built with ``step_mult`` 1 and the recipe's ``optimizer_kwargs``, then
  scaled by the rate (its step is linear in ``step_mult``); ``num_steps`` for one with a learned schedule."""
  from metafam.benchmark.runner import load_theta  # pylint: disable=import-outside-toplevel
  from metafam.optimizers.contract import uses_horizon  # pylint: disable=import-outside-toplevel
  from metafam.optimizers.registry import get_learned_optimizer  # pylint: disable=import-outside-toplevel
  from metafam.runs import checkpoint  # pylint: disable=import-outside-toplevel
  meta = checkpoint.read_metadata(path)
  if not meta.get("optimizer"):
    raise ValueError(f"--candidate {path}: its header names no learned optimizer; write it with "
                     "experiments/export_pretrained.py --candidate")
  kwargs = (meta.get("recipe") or {}).get("optimizer_kwargs") or {}
  lopt = get_learned_optimizer(meta["optimizer"], step_mult=1.0, **kwargs)
  horizon = {"num_steps": num_steps} if uses_horizon(lopt) else {}
  base = lopt.as_optax(load_theta(path), **horizon)
  return lambda learning_rate: optax.chain(base, optax.scale(learning_rate))


# -- training -----------------------------------------------------------------------------------------------------
def trainer(model, factory, steps: int, eval_every: int, batch: int):
  """A jitted ``run(learning_rate, key, data) -> (valid f32[E], test f32[E])``: losses at steps 0, eval_every, ..."""
  init, apply = model

  def loss_fn(params, x, y):
    logp = jax.nn.log_softmax(apply(params, x))
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=-1))

  @jax.jit
  def run(learning_rate, key, data):
    (x, y), valid, test = data
    tx = factory(learning_rate)
    k_init, k_steps = jax.random.split(key)
    params = init(k_init)

    def step(carry, k):
      params, state = carry
      idx = jax.random.randint(k, (batch,), 0, x.shape[0])
      grads = jax.grad(loss_fn)(params, x[idx], y[idx])
      updates, state = tx.update(grads, state, params)
      return (optax.apply_updates(params, updates), state), None

    def block(carry, keys):
      carry, _ = jax.lax.scan(step, carry, keys)
      return carry, (loss_fn(carry[0], *valid), loss_fn(carry[0], *test))

    keys = jax.random.split(k_steps, steps).reshape(steps // eval_every, eval_every)
    _, (v, t) = jax.lax.scan(block, (params, tx.init(params)), keys)
    first = (loss_fn(params, *valid), loss_fn(params, *test))
    return jnp.concatenate([first[0][None], v]), jnp.concatenate([first[1][None], t])
  return run


def first_step_at_or_below(curve, steps, target):
  """The first evaluation step whose loss is <= target, or None."""
  hits = np.nonzero(np.asarray(curve) <= target)[0]
  return int(steps[hits[0]]) if hits.size else None


def tune(run, grid, data):
  """``(chosen rate, at edge, mean test curve of seeds 0 and 1)``: seed 0 at every rate, chosen by the final
  held-out loss (a non-finite loss is never chosen), then seed 1 at the chosen rate."""
  finals, curves = [], []
  for lr in grid:
    valid, test = run(jnp.float32(lr), jax.random.key(0), data)
    valid, test = np.asarray(valid), np.asarray(test)
    ok = np.all(np.isfinite(valid)) and np.all(np.isfinite(test))
    finals.append(valid[-1] if ok else np.inf)
    curves.append(test)
  best = int(np.argmin(finals))
  if not np.isfinite(finals[best]):
    return None, False, None
  second = np.asarray(run(jnp.float32(grid[best]), jax.random.key(1), data)[1])
  return grid[best], best in (0, len(grid) - 1), (curves[best] + second) / 2


def load_data(data_dir, smoke):
  """``((x_train, y_train), (x_valid, y_valid), (x_test, y_test))`` on the device, images in [0, 1] as [N, 784]."""
  if smoke:
    raw = image_data.embedded_fashion_mnist()
  else:
    directory = image_data.resolve_data_dir(
        data_dir, image_data.FASHION_MNIST_ENV, image_data.DEBIAN_FASHION_MNIST_DIR,
        " The full Fashion-MNIST (MIT licence) is Debian's package dataset-fashion-mnist, or pass --data_dir with "
        "the four IDX files of the Zalando Research fashion-mnist repository.")
    raw = image_data.read_mnist_style_dir(directory)
  pair = lambda x, y: (jnp.asarray(x.reshape(len(x), -1), jnp.float32) / 255.0, jnp.asarray(y, jnp.int32))
  test = tuple(np.concatenate(parts) for parts in zip(raw["outer_valid"], raw["test"]))
  return pair(*raw["train"]), pair(*raw["inner_valid"]), pair(*test)


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--models", nargs="+", default=None, help=f"any of {', '.join(MODELS)} (default: all)")
  parser.add_argument("--optimizers", nargs="+", default=["adam", "muon", *pretrained.list()],
                      help="adam, muon and shipped learned optimizers (metafam.pretrained.list())")
  parser.add_argument("--candidate", nargs="+", default=[], metavar="THETA",
                      help="theta files of learned optimizers that are not shipped (export_pretrained.py --candidate)")
  parser.add_argument("--steps", type=int, default=1000)
  parser.add_argument("--eval_every", type=int, default=50, help="test and held-out losses every this many steps")
  parser.add_argument("--batch", type=int, default=128)
  parser.add_argument("--data_dir", default=None, help="the four Fashion-MNIST IDX files (default: see above)")
  parser.add_argument("--markdown", metavar="PATH", help="also write the table as Markdown")
  parser.add_argument("--json", metavar="PATH", help="write every curve and choice as JSON after each (model, "
                      "optimizer); the same command again resumes from it")
  parser.add_argument("--smoke", action="store_true", help="every code path in seconds; the numbers mean nothing")
  args = parser.parse_args()
  models = SMOKE_MODELS if args.smoke else MODELS
  grid = GRID[2:4] if args.smoke else GRID
  if args.smoke:
    args.steps, args.eval_every, args.batch = 20, 10, 32
  args.models = args.models or list(models)
  bad = [m for m in args.models if m not in models]
  if bad:
    parser.error(f"--models: unknown {', '.join(bad)}; choose from {', '.join(models)}")
  known = ["adam", "muon", *pretrained.list()]
  bad = [o for o in args.optimizers if o not in known]
  if bad:
    parser.error(f"--optimizers: unknown {', '.join(bad)}; choose from {', '.join(known)}")
  if min(args.steps, args.eval_every, args.batch) < 1 or args.steps % args.eval_every:
    parser.error("--steps, --eval_every and --batch must be positive, and --eval_every must divide --steps")
  candidates = {os.path.splitext(os.path.basename(p))[0]: p for p in args.candidate}
  clash = [c for c in candidates if c in known]
  missing = [p for p in args.candidate if not os.path.isfile(p)]
  if missing:
    parser.error(f"--candidate: no such file: {', '.join(missing)}")
  if clash or len(candidates) < len(args.candidate):
    parser.error("--candidate: a file's name without its extension names its row; it must differ from the other "
                 f"files' and from {', '.join(known)}")
  for path in candidates.values():  # a bad file is refused before any training
    try:
      candidate_factory(path, args.steps)
    except (ValueError, OSError) as e:
      parser.error(str(e))
  optimizers = [REFERENCE] + [o for o in dict.fromkeys(args.optimizers) if o != REFERENCE] + list(candidates)
  data = load_data(args.data_dir, args.smoke)
  settings = {"grid": list(grid), "steps": args.steps, "eval_every": args.eval_every, "batch": args.batch,
              "smoke": args.smoke}
  record = dict(settings, models={})
  if args.json and os.path.exists(args.json):  # resume: keep every (model, optimizer) already there
    with open(args.json) as f:
      record = json.load(f)
    if {k: record.get(k) for k in settings} != settings:
      parser.error(f"--json: {args.json} holds a run with other settings ({ {k: record.get(k) for k in settings} }); "
                   "choose another path")
  rows = []
  for model_name in args.models:
    model = models[model_name]()
    done = record["models"].setdefault(model_name, {})
    for opt_name in optimizers:
      if opt_name not in done:
        reference = done.get(REFERENCE, {}).get("reference_curve")
        done[opt_name] = evaluate(model, opt_name, grid, data, args, reference, candidates)
        if args.json:
          _write(args.json, json.dumps(record, indent=1) + "\n")
      rows.append(row(model_name, opt_name, done[opt_name]))
      print(" | ".join(rows[-1]), flush=True)
  columns = ["model", "optimizer", "rate", "final test loss", "best test loss", "speedup over tuned Adam", "s"]
  table = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)] + ["| " + " | ".join(r) + " |"
                                                                             for r in rows]
  if args.markdown:
    _write(args.markdown, "\n".join(table) + "\n")


def evaluate(model, opt_name, grid, data, args, reference_curve, candidates=None):
  """One (model, optimizer): its tuned rate, mean test curve and speedup over tuned Adam (whose 4x-horizon curve is
  ``reference_curve``, or computed here when ``opt_name`` is Adam), as a JSON-able dict."""
  start = time.perf_counter()
  run = trainer(model, optimizer_factory(opt_name, args.steps, candidates), args.steps, args.eval_every, args.batch)
  lr, at_edge, curve = tune(run, grid, data)
  entry = {"learning_rate": lr, "at_edge": at_edge, "curve": None if curve is None else curve.tolist()}
  if opt_name == REFERENCE and lr is not None:  # tuned Adam for 4x the horizon, seeds 0 and 1
    long = trainer(model, optimizer_factory(opt_name, REFERENCE_FACTOR * args.steps), REFERENCE_FACTOR * args.steps,
                   args.eval_every, args.batch)
    reference_curve = np.mean([np.asarray(long(jnp.float32(lr), jax.random.key(s), data)[1]) for s in (0, 1)],
                              axis=0).tolist()
    entry["reference_curve"] = reference_curve
  if curve is not None:
    steps = np.arange(0, args.steps + 1, args.eval_every)
    long_steps = np.arange(0, REFERENCE_FACTOR * args.steps + 1, args.eval_every)
    best, own = float(np.min(curve)), int(steps[int(np.argmin(curve))])
    adam = None if reference_curve is None else first_step_at_or_below(reference_curve, long_steps, best)
    speedup = ("" if reference_curve is None else f"{adam / max(own, 1):.2f}x" if adam is not None
               else f"> {long_steps[-1] / max(own, 1):.2f}x")
    entry.update(best=best, final=float(curve[-1]), best_step=own, adam_steps=adam, speedup=speedup)
  entry["seconds"] = time.perf_counter() - start
  return entry


def row(model_name, opt_name, entry):
  if entry["curve"] is None:
    return [model_name, opt_name, "diverged", "", "", "", f"{entry['seconds']:.0f}"]
  return [model_name, opt_name, f"{entry['learning_rate']:.2g}{'*' if entry['at_edge'] else ''}",
          f"{entry['final']:.4f}", f"{entry['best']:.4f}", entry["speedup"], f"{entry['seconds']:.0f}"]


def _write(path, text):
  from metafam.io import atomic_write  # pylint: disable=import-outside-toplevel
  atomic_write(path, text.encode("utf-8"))
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
