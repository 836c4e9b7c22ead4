"""Patch-based image classifiers (dm-haiku): a Vision Transformer and an MLP-Mixer.

Both cut ``f32[B, H, W, C]`` images into ``P x P`` patches with a stride-P VALID convolution (``N = floor(H/P) *
floor(W/P)`` tokens of width D; ``(P*P*C + 1) * D`` parameters) and end with a LayerNorm (``2*D``) and a Linear head
(``(D + 1) * K``).

* `vit_forward` (Dosovitskiy et al., 2021): a learned class token (``D``) and position embeddings (``(N + 1) * D``;
  ``N * D`` with global average pooling), then L non-causal pre-LayerNorm blocks of
  `metafam.tasks.language.transformer_block` (``4*D + (D + 1)*3*D + (D + 1)*D + (D + 1)*M + (M + 1)*D`` each, MLP
  width M, GELU); the head reads the class token (or the token mean).
* `mlp_mixer_forward` (Tolstikhin et al., 2021): L blocks of ``x + TokenMLP(LN(x))`` then ``x + ChannelMLP(LN(x))``
  (``4*D + (N + 1)*T + (T + 1)*N + (D + 1)*Cm + (Cm + 1)*D`` each, token width T, channel width Cm, GELU); the head
  reads the token mean.

`vit_num_params` and `mlp_mixer_num_params` give these counts. `MLPMixerTask` is an MLP-Mixer classifier task on an
image `Datasets` (the heldout suite's ``mnist_mixer_16x16_p4_32x2_b64``).
"""

from __future__ import annotations

from typing import Optional

import haiku as hk
import jax
import jax.numpy as jnp

from metafam._checks import check_positive_int
from metafam.datasets.base import Datasets
from metafam.tasks.image_mlp import ImageClassifierTask
from metafam.tasks.language import transformer_block

CLASSIFIERS = ("token", "gap")


def _patches(images: jax.Array, patch_size: int, width: int) -> jax.Array:
  h, w = images.shape[1:3]
  if patch_size > min(h, w):
    raise ValueError(f"patch_size {patch_size} exceeds the image sides {h}x{w}.")
  x = hk.Conv2D(width, patch_size, stride=patch_size, padding="VALID", name="embedding")(images)
  return x.reshape(x.shape[0], -1, width)


def _head(x: jax.Array, num_classes: int) -> jax.Array:
  return hk.Linear(num_classes, name="head")(x)


def _layer_norm(name: str):
  return hk.LayerNorm(axis=-1, create_scale=True, create_offset=True, name=name)


def vit_forward(num_classes: int, patch_size: int, hidden_size: int, num_layers: int, num_heads: int, mlp_dim: int,
                classifier: str = "token", dropout_rate: float = 0.0,
                attention_dropout_rate: float = 0.0) -> hk.Transformed:
  """A Vision Transformer ``forward(images f32[B, H, W, C], dropout_key=None) -> logits f32[B, num_classes]``.

  With a ``dropout_key``: dropout on the embedded tokens and the residual branches (``dropout_rate``) and on the
  attention weights (``attention_dropout_rate``)."""
  if classifier not in CLASSIFIERS:
    raise ValueError(f"classifier must be one of {CLASSIFIERS}, got {classifier!r}.")
  if hidden_size % num_heads:
    raise ValueError(f"hidden_size {hidden_size} must be divisible by num_heads {num_heads}.")

  def forward(images, dropout_key=None):
    x = _patches(images, patch_size, hidden_size)
    if classifier == "token":
      cls = hk.get_parameter("cls", [1, 1, hidden_size], x.dtype, init=jnp.zeros)
      x = jnp.concatenate([jnp.tile(cls, (x.shape[0], 1, 1)), x], axis=1)
    pos = hk.get_parameter("position_embeddings", [1, x.shape[1], hidden_size], x.dtype,
                           init=hk.initializers.RandomNormal(0.02))
    x = x + pos
    if dropout_rate and dropout_key is not None:
      x = hk.dropout(jax.random.fold_in(dropout_key, 10 ** 6), dropout_rate, x)
    for i in range(num_layers):
      x = transformer_block(x, i, num_heads, mlp_dim, jax.nn.gelu, False, None, None, None, dropout_rate, dropout_key,
                            attention_dropout_rate)
    x = _layer_norm("encoder_norm")(x)
    return _head(x[:, 0] if classifier == "token" else jnp.mean(x, axis=1), num_classes)

  return hk.without_apply_rng(hk.transform(forward))


def vit_num_params(image_shape, num_classes: int, patch_size: int, hidden_size: int, num_layers: int,
                   mlp_dim: int, classifier: str = "token") -> int:
  """The parameter count of `vit_forward` on images ``(H, W, C)`` (see the module docstring)."""
  (h, w, c), d, m = image_shape, hidden_size, mlp_dim
  n = (h // patch_size) * (w // patch_size) + (classifier == "token")
  block = 4 * d + (d + 1) * 3 * d + (d + 1) * d + (d + 1) * m + (m + 1) * d
  return ((patch_size ** 2 * c + 1) * d + (d if classifier == "token" else 0) + n * d + num_layers * block + 2 * d
          + (d + 1) * num_classes)


def mlp_mixer_forward(num_classes: int, patch_size: int, hidden_dim: int, num_blocks: int, tokens_mlp_dim: int,
                      channels_mlp_dim: int) -> hk.Transformed:
  """An MLP-Mixer ``forward(images f32[B, H, W, C]) -> logits f32[B, num_classes]``."""

  def mlp(x, width, name):
    return hk.Linear(x.shape[-1], name=f"{name}_out")(jax.nn.gelu(hk.Linear(width, name=f"{name}_in")(x)))

  def forward(images):
    x = _patches(images, patch_size, hidden_dim)
    for i in range(num_blocks):
      y = jnp.swapaxes(_layer_norm(f"ln_tokens_{i}")(x), 1, 2)
      x = x + jnp.swapaxes(mlp(y, tokens_mlp_dim, f"token_mixing_{i}"), 1, 2)
      x = x + mlp(_layer_norm(f"ln_channels_{i}")(x), channels_mlp_dim, f"channel_mixing_{i}")
    return _head(jnp.mean(_layer_norm("pre_head_norm")(x), axis=1), num_classes)

  return hk.without_apply_rng(hk.transform(forward))


def mlp_mixer_num_params(image_shape, num_classes: int, patch_size: int, hidden_dim: int, num_blocks: int,
                         tokens_mlp_dim: int, channels_mlp_dim: int) -> int:
  """The parameter count of `mlp_mixer_forward` on images ``(H, W, C)`` (see the module docstring)."""
  (h, w, c), d, t, cm = image_shape, hidden_dim, tokens_mlp_dim, channels_mlp_dim
  n = (h // patch_size) * (w // patch_size)
  block = 4 * d + (n + 1) * t + (t + 1) * n + (d + 1) * cm + (cm + 1) * d
  return (patch_size ** 2 * c + 1) * d + num_blocks * block + 2 * d + (d + 1) * num_classes


class MLPMixerTask(ImageClassifierTask):
  """An MLP-Mixer classifier (`mlp_mixer_forward`) on an image `Datasets`.

  Args:
    datasets: the data (images ``f32[B, H, W, C]`` with ``H`` and ``W`` multiples of ``patch_size``).
    patch_size, hidden_dim, num_blocks, tokens_mlp_dim, channels_mlp_dim: see `mlp_mixer_forward`.
    name: the task's name.

  Parameter count: `mlp_mixer_num_params`.
  """

  def __init__(self, datasets: Datasets, patch_size: int = 4, hidden_dim: int = 32, num_blocks: int = 2,
               tokens_mlp_dim: int = 32, channels_mlp_dim: int = 64, name: Optional[str] = None):
    patch_size = check_positive_int("patch_size", patch_size)
    hidden_dim, num_blocks, tokens_mlp_dim, channels_mlp_dim = (
        check_positive_int(n, v) for n, v in (("hidden_dim", hidden_dim), ("num_blocks", num_blocks),
                                              ("tokens_mlp_dim", tokens_mlp_dim), ("channels_mlp_dim", channels_mlp_dim)))
    shape = datasets.abstract_batch["image"].shape
    if shape[1] % patch_size or shape[2] % patch_size:
      raise ValueError(f"patch_size must divide the image's height and width {tuple(shape[1:3])}, got "
                       f"{patch_size}.")
    self.datasets = datasets
    self.num_classes = int(datasets.extra_info.get("num_classes", 10))
    self.net = mlp_mixer_forward(self.num_classes, patch_size, hidden_dim, num_blocks, tokens_mlp_dim,
                                 channels_mlp_dim)
    self.name = name or f"MLPMixer_{'x'.join(map(str, shape[1:3]))}_p{patch_size}_{hidden_dim}x{num_blocks}"
