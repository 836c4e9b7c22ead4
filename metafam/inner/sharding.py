"""Spreading the lanes of vectorized inner training over several devices.

Lanes are independent, so a ``[num_tasks, ...]`` lane state splits along its leading axis with no communication
except the few scalars the unroll reduces over all lanes (whether any lane resets). The helpers here build a 1-D
mesh with the axis ``"task"`` and place trees on it: lane-major leaves sharded ``P("task")``, everything else
(theta, keys, datasets) replicated.

On CPU, JAX shows one device unless told otherwise; to use both cores of a 2-core machine, call
``jax.config.update("jax_num_cpu_devices", 2)`` before JAX is first used (or pass ``--devices 2`` to the CLI). XLA
then runs each device's share of the lanes on its own core, which helps most when the per-lane work is too small
for XLA's intra-op threads (small models, hand-designed optimizers).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

LANE_AXIS = "task"


def check_lane_split(num_tasks: int, num_devices: int, lanes: str = "num_tasks", devices: str = "") -> None:
  """Raises ValueError unless ``num_tasks`` lanes split evenly over ``num_devices`` devices (`lane_mesh`'s rule,
  checkable before any device exists). ``lanes`` names the lane count; ``devices`` says how the devices were asked
  for, before their count (default: nothing)."""
  if num_tasks % num_devices:
    asked = f"{devices} " if devices else ""
    raise ValueError(f"{lanes}={num_tasks} lanes cannot be split evenly over {asked}{num_devices} devices; use a "
                     f"multiple of {num_devices}.")


def lane_mesh(devices: Union[None, int, Sequence[Any]], num_tasks: int) -> Optional[Mesh]:
  """A 1-D ``("task",)`` mesh over ``devices``, or None when that is a single device (nothing to shard).

  Args:
    devices: None (the default device only), a count ``n`` (the first ``n`` of `jax.devices()`), or a sequence of
      devices.
    num_tasks: the number of lanes; it must divide evenly over the devices.
  """
  if devices is None:
    return None
  if isinstance(devices, (int, np.integer)) and not isinstance(devices, bool):
    available = jax.devices()
    if not 1 <= devices <= len(available):
      hint = (" On CPU, call jax.config.update('jax_num_cpu_devices', N) before JAX is first used."
              if available[0].platform == "cpu" else "")
      raise ValueError(f"devices={devices}, but {len(available)} {available[0].platform} device(s) are "
                       f"available.{hint}")
    devs = list(available[:devices])
  else:
    devs = list(devices)
    if not devs or not all(isinstance(d, jax.Device) for d in devs):
      raise TypeError(f"devices must be None, a positive int or a sequence of jax.Device, got {devices!r}.")
    if len(set(devs)) != len(devs):
      raise ValueError(f"devices lists a device twice: {devs}.")
  if len(devs) == 1:
    return None
  check_lane_split(num_tasks, len(devs))
  return Mesh(np.asarray(devs), (LANE_AXIS,), axis_types=(AxisType.Auto,))


def platform(devices: Union[None, int, Sequence[Any]]) -> str:
  """The platform ("cpu", "gpu", "tpu") of the devices a `lane_mesh` is built from (``None``: JAX's default
  backend; a count: the first of `jax.devices()`)."""
  if devices is None:
    return jax.default_backend()
  if isinstance(devices, (int, np.integer)) and not isinstance(devices, bool):
    return jax.devices()[0].platform
  return list(devices)[0].platform


def lane_sharding(mesh: Mesh, leading: int = 0) -> NamedSharding:
  """Sharding that splits axis ``leading`` (the lane axis) over the mesh and replicates the rest."""
  return NamedSharding(mesh, P(*([None] * leading + [LANE_AXIS])))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def layout_shardings(lane_major: Any, mesh: Mesh) -> Any:
  """A tree of shardings for a tree of bools: split by lane where True, replicated where False."""
  return jax.tree.map(lambda split: lane_sharding(mesh) if split else replicated(mesh), lane_major)


def place(tree: Any, mesh: Optional[Mesh], lane_major: Any = True) -> Any:
  """``tree`` laid out on the mesh: leaves whose flag is True split along their leading (lane) axis, the others
  replicated; ``lane_major`` is one bool for every leaf or a tree of bools like ``tree``. A no-op without a mesh.

  The one placement helper of every layer: outside jit it moves the arrays (`jax.device_put`, a no-op for arrays
  already placed so); inside jit it constrains the traced values to that layout, so a jitted function's outputs
  come back laid out as its inputs were (and the next call reuses the compiled program).
  """
  if mesh is None:
    return tree
  flags = jax.tree.map(lambda _: lane_major, tree) if isinstance(lane_major, bool) else lane_major
  shardings = layout_shardings(flags, mesh)
  if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(tree)):
    return jax.lax.with_sharding_constraint(tree, shardings)
  if mesh.is_multi_process:
    return jax.tree.map(_put_global, tree, shardings)
  return jax.device_put(tree, shardings)


def is_multi_process(mesh: Optional[Mesh]) -> bool:
  """Whether ``mesh`` spans the devices of several processes (`metafam.distributed`)."""
  return mesh is not None and mesh.is_multi_process


def local_devices(mesh: Mesh) -> list:
  """The devices of ``mesh`` that belong to this process, in mesh order."""
  return [d for d in mesh.devices.flat if d.process_index == jax.process_index()]


def _put_global(x: Any, target: NamedSharding) -> Any:
  """One leaf onto a mesh of several processes.

  Arrays already laid out over that mesh (outputs of the jitted programs) are resharded if needed; a
  process-local value (a numpy array, or a jax.Array on this process's device) goes through numpy, which every
  process holds in full and `device_put` cuts into the shards this process owns, so every process must pass the
  same value (SPMD). PRNG keys travel as their raw data.
  """
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    return jax.device_put(x, target)
  if hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
    data = jax.device_put(np.asarray(jax.random.key_data(x)), target)
    return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
  return jax.device_put(np.asarray(x), target)
