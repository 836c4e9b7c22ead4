"""Hand-designed optax optimizers as factories of one argument, the learning rate (a number or an optax schedule).

`OPTAX_FACTORIES` maps a name to ``f(learning_rate) -> optax.GradientTransformation``; every other optimizer
hyper-parameter is the optax default unless stated. It is the one registry of hand-designed optimizers: every tuned
baseline is one of its entries (`metafam.benchmark.baselines.tune_baseline`; each shipped suite names its own in
`metafam.benchmark.baseline_files.SUITE_SPECS`), and `metafam.optimizers.registry.HAND_DESIGNED` is its entries as
metafam `Optimizer` objects (``adam``, ``sgd`` and ``sgdm`` as metafam's `Adam`, `SGD`, `SGDM`, the same updates).

* ``adam``, ``adamw`` (decoupled weight decay 1e-4), ``nadamw`` (Nesterov Adam, weight decay 1e-4).
* ``sgd``: plain SGD; ``sgdm``: SGD with heavy-ball momentum 0.9.
* ``sgd_nesterov``: SGD with Nesterov momentum 0.9.
* ``rmsprop``: decay 0.9, eps 1e-8, no momentum.
* ``lion``: sign of interpolated momenta (b1 0.9, b2 0.99), decoupled weight decay 1e-3.
* ``adafactor``: factored second moments, updates relative to the parameter scale, update clipping 1.0.
* ``muon``: Newton-Schulz orthogonalized Nesterov momentum (beta 0.95, 5 iterations) on every 2-D parameter, Adam on
  the rest (biases, norm scales, conv kernels), one learning rate for both (`optax.contrib.muon`).
* ``schedule_free_adamw``: schedule-free AdamW (`optax.contrib.schedule_free_adamw`, b1 0.9). It trains at the
  point ``y`` and is evaluated, as its authors and AlgoPerf evaluate it, at the averaged point ``x``
  (``optax.contrib.schedule_free_eval_params``; `metafam.optimizers.base.OptaxOptimizer.eval_params`).
* ``ademamix``: AdEMAMix (`optax.contrib.ademamix`: Adam's fast momentum b1 0.9 mixed with a slow one, b3 0.9999,
  weight alpha 5; no warmup of alpha or b3).

Importing this module builds nothing.
"""

from __future__ import annotations

import functools
from typing import Callable, Dict, List

import optax

OptaxFactory = Callable[..., optax.GradientTransformation]

OPTAX_FACTORIES: Dict[str, OptaxFactory] = {
    "adam": optax.adam,
    "sgd": optax.sgd,
    "sgdm": functools.partial(optax.sgd, momentum=0.9),
    "adamw": optax.adamw,
    "nadamw": optax.nadamw,
    "sgd_nesterov": functools.partial(optax.sgd, momentum=0.9, nesterov=True),
    "rmsprop": optax.rmsprop,
    "lion": optax.lion,
    "adafactor": optax.adafactor,
    "muon": optax.contrib.muon,
    "schedule_free_adamw": optax.contrib.schedule_free_adamw,
    "ademamix": optax.contrib.ademamix,
}


def list_optax_factories() -> List[str]:
  """The names of `OPTAX_FACTORIES`, sorted."""
  return sorted(OPTAX_FACTORIES)
