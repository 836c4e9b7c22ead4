"""Neural-network helpers the built-in tasks (and the families built on them) share."""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from metafam._registry import lookup

ACTIVATIONS = {"relu": jax.nn.relu, "tanh": jnp.tanh, "gelu": jax.nn.gelu, "swish": jax.nn.swish,
               "elu": jax.nn.elu, "sigmoid": jax.nn.sigmoid}


def activation_by_name(name: str) -> Callable:
  """``ACTIVATIONS[name]``, or `metafam.UnknownNameError` listing the valid names."""
  return lookup(ACTIVATIONS, name, "activation")


def num_params(params: Any) -> int:
  """The number of scalars in the pytree ``params``."""
  return int(sum(np.prod(np.shape(p)) for p in jax.tree.leaves(params)))
