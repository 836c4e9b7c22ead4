"""`learned_optimization.tasks.parametric.vit`: the reference's parametric Vision Transformer family.

`ParametricVIT(datasets, **kwargs)` (``patch_size``, ``hidden_size``, ``mlp_dim``, ``num_heads``, ``layers``,
``dropout``, ``attension_dropout`` -- the reference's spelling) has no per-instance randomness; its task is
`tasks.fixed.vit.VisionTransformerTask` (metafam's `vit_forward`, dropout keyed by the loss key). `sample_vit`
draws a family configuration (sampled image dataset at a log-uniform side in [8, 64)).
"""

from __future__ import annotations

import jax
import numpy as np

from metafam.compat.learned_optimization.tasks import base
from metafam.compat.learned_optimization.tasks.fixed.vit import VisionTransformerTask
from metafam.compat.learned_optimization.tasks.parametric import cfgobject, parametric_utils as pu
from metafam.datasets.base import Datasets

Batch = base.Batch
Params = base.Params
ModelState = base.ModelState

__all__ = ["Batch", "Params", "ModelState", "ParametricVIT", "sample_vit", "timed_sample_vit"]

_KWARGS = ("patch_size", "hidden_size", "mlp_dim", "num_heads", "layers", "dropout", "attension_dropout")


class ParametricVIT(base.TaskFamily):
  """ViTs with the given sizes and dropout rates on ``datasets`` (class-token classifier)."""

  def __init__(self, datasets: Datasets, **kwargs):
    super().__init__()
    missing = [k for k in _KWARGS if k not in kwargs]
    if missing:
      raise ValueError(f"ParametricVIT needs {', '.join(missing)} (all of {', '.join(_KWARGS)}).")
    self.datasets = datasets
    p = int(kwargs["patch_size"])
    self.vision_transformer_cfg = {
        "model_name": "ParametricVIT", "patches": {"size": (p, p)}, "hidden_size": int(kwargs["hidden_size"]),
        "transformer": {"mlp_dim": int(kwargs["mlp_dim"]), "num_heads": int(kwargs["num_heads"]),
                        "num_layers": int(kwargs["layers"]), "dropout_rate": float(kwargs["dropout"]),
                        "attention_dropout_rate": float(kwargs["attension_dropout"])},
        "classifier": "token", "representation_size": None}

  def sample(self, key: jax.Array) -> cfgobject.CFGNamed:
    return cfgobject.CFGNamed("ParametricVIT", {})

  def task_fn(self, task_params: cfgobject.CFGNamed) -> base.Task:
    return VisionTransformerTask(self.vision_transformer_cfg, self.datasets, name="ParametricVIT")


def sample_vit(key: jax.Array) -> cfgobject.CFGObject:
  """A `ParametricVIT` configuration: 1-15 layers, 1-15 heads of width in [8, 64) (fewer than 4 heads) or [8, 32),
  MLP in [32, 512), patches of 2-16, and with probability 0.7 dropout rates uniform in [0, 0.8)."""
  k = jax.random.split(key, 12)
  lf = cfgobject.LogFeature
  heads = pu.log_int(k[1], 1, 16)
  width = pu.log_int(k[2], 8, 64 if heads < 4 else 32) * heads
  side, batch_size = pu.log_int(k[5], 8, 64), pu.log_int(k[6], 4, 256)
  use = float(jax.random.uniform(k[10], []) > 0.3)
  kwargs = {"layers": lf(pu.log_int(k[0], 1, 16)), "num_heads": lf(heads), "hidden_size": lf(width),
            "mlp_dim": lf(pu.log_int(k[3], 32, 512)),
            "datasets": cfgobject.CFGObject(pu.SampleImageDataset.sample(k[4]),
                                            {"image_size": lf((side, side)), "batch_size": lf(batch_size)}),
            "patch_size": pu.choice(k[7], [2, 4, 8, 12, 16]),
            "dropout": float(jax.random.uniform(k[8], [], minval=0, maxval=0.8)) * use,
            "attension_dropout": float(jax.random.uniform(k[9], [], minval=0, maxval=0.8)) * use}
  kwargs["patch_size"] = int(np.minimum(kwargs["patch_size"], side))
  return cfgobject.CFGObject("ParametricVIT", kwargs)


def timed_sample_vit(key: jax.Array, max_time: float = 1e-4):
  """Not available offline (the reference's learned runtime models); raises NotImplementedError."""
  pu.timed_sampler_unavailable("timed_sample_vit", "sample_vit")
