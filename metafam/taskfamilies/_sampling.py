"""Sampling and initialization helpers the built-in task families share: range and activation checks, scalar
draws, haiku init from one random draw, and `SampledInstance`, a task instance of a haiku-model family."""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence, Tuple

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

from metafam.tasks._nn import ACTIVATIONS
from metafam.tasks.base import Task

Range = Tuple[float, float]


def check_range(name: str, value: Sequence[float], low: Optional[float] = None, high: Optional[float] = None,
                positive: bool = False) -> Range:
  """``value`` as a float pair ``(a, b)`` with ``a <= b`` inside ``[low, high]`` (and ``a > 0`` if positive)."""
  a, b = (float(x) for x in value)
  ok = a <= b and (low is None or a >= low) and (high is None or b <= high) and (not positive or a > 0)
  if not ok:
    limits = [f"low >= {low}"] * (low is not None) + [f"high <= {high}"] * (high is not None) + ["low > 0"] * positive
    raise ValueError(f"{name} must be a pair low <= high" + (f" with {', '.join(limits)}" if limits else "")
                     + f", got {tuple(value)!r}.")
  return a, b


def check_activations(activations: Sequence[str]) -> Tuple[str, ...]:
  unknown = [a for a in activations if a not in ACTIVATIONS]
  if unknown or not activations:
    raise ValueError(f"activations must be a non-empty list from {sorted(ACTIVATIONS)}; unknown: {unknown}.")
  return tuple(activations)


def log_uniform(key: jax.Array, value_range: Range) -> jax.Array:
  """An f32 scalar log-uniform in ``value_range`` (both ends positive)."""
  return jnp.exp(jax.random.uniform(key, (), jnp.float32, np.log(value_range[0]), np.log(value_range[1])))


def uniform(key: jax.Array, value_range: Range) -> jax.Array:
  """An f32 scalar uniform in ``value_range``."""
  return jax.random.uniform(key, (), jnp.float32, value_range[0], value_range[1])


def _init_stddev(name: str, shape: Sequence[int]) -> Optional[float]:
  """Haiku's default init of a parameter called ``name``: a stddev for truncated normals, 0.0 zeros, None ones."""
  if name == "w":  # Linear, Conv and LSTM kernels: TruncatedNormal(1 / sqrt(fan_in)), fan_in = prod(shape[:-1])
    return 1.0 / math.sqrt(max(1, int(np.prod(shape[:-1]))))
  if name in ("embeddings", "position_embeddings"):
    return 1.0
  if name in ("b", "offset"):
    return 0.0
  if name == "scale":
    return None
  raise ValueError(f"init_from_one_draw has no rule for a parameter called {name!r}; add one to _init_stddev.")


def init_from_one_draw(net: hk.Transformed, key: jax.Array, *inputs) -> Any:
  """``net.init(key, *inputs)`` with every random parameter cut from a single truncated-normal draw.

  ``inputs`` may be arrays or `jax.ShapeDtypeStruct`s: only their shapes and dtypes are used.

  Same per-parameter distributions as haiku's defaults for the modules the built-in families use: ``w`` (Linear,
  Conv, LSTM) ~ N(0, 1 / fan_in) and ``embeddings`` / ``position_embeddings`` ~ N(0, 1), truncated at 2 std; ``b``
  and ``offset`` zeros, ``scale`` ones; any other parameter name is a ValueError. Only the random stream differs
  from ``net.init``: one random op instead of one (plus a key split) per tensor, so a vmapped init of many
  instances compiles several times faster on CPU (measured: docs/performance/inner-loop.md).
  """
  abstract = jax.eval_shape(net.init, key, *inputs)
  leaves, treedef = jax.tree_util.tree_flatten_with_path(abstract)
  stddevs = [_init_stddev(path[-1].key, leaf.shape) for path, leaf in leaves]
  sizes = [int(np.prod(leaf.shape)) if s else 0 for (_, leaf), s in zip(leaves, stddevs)]
  draw = jax.random.truncated_normal(key, -2.0, 2.0, (sum(sizes),), jnp.float32)
  out, offset = [], 0
  for (_, leaf), stddev, size in zip(leaves, stddevs, sizes):
    if stddev is None:
      out.append(jnp.ones(leaf.shape, leaf.dtype))
    elif stddev == 0.0:
      out.append(jnp.zeros(leaf.shape, leaf.dtype))
    else:
      out.append((stddev * draw[offset:offset + size]).reshape(leaf.shape).astype(leaf.dtype))
      offset += size
  return jax.tree_util.tree_unflatten(treedef, out)


def scale_weights(params, scale, names: Sequence[str] = ("w",)):
  """Haiku ``params`` with every parameter called one of ``names`` (dense and conv weights) multiplied by ``scale``.

  Biases, LayerNorm scales/offsets and embeddings are left alone.
  """
  return {module: {k: v * scale if k in names else v for k, v in p.items()} for module, p in params.items()}


class SampledInstance(Task):
  """A task instance of a haiku-model family: ``family.net`` initialized from one random draw, weights scaled by
  ``cfg["init_scale"]``; ``input_key`` names the batch entry the model reads."""

  input_key = "image"

  def __init__(self, family, cfg):
    self.family, self.cfg, self.datasets = family, cfg, family.datasets
    self.name = family.name

  def init(self, key):
    example = self.datasets.abstract_batch[self.input_key]
    return scale_weights(init_from_one_draw(self.family.net, key, example), self.cfg["init_scale"])
