"""Small convolutional classifiers on images (dm-haiku models), including a CIFAR-shaped (32x32x3) one.

Architecture: ``[Conv2D(c_i, k x k, stride 2, SAME) -> activation] * L -> global average pool -> Linear(classes)``.
Parameters: ``sum_i (k * k * c_{i-1} + 1) * c_i + (c_L + 1) * classes`` with ``c_0`` the input channels. Registered:

  * ``fmnist_conv_16x16_16x32``: 16x16x1, channels (16, 32): 5,130 params.
  * ``fmnist_conv_28x28_16x32x32``: 28x28x1, channels (16, 32, 32): 14,378 params.
  * ``fmnist_conv_32x32x3_16x32x64``: CIFAR-shaped 32x32x3 (embedded Fashion-MNIST, gray repeated), channels
    (16, 32, 64): 24,234 params; `cifar10_conv_task` builds the same model on real CIFAR-10 files.
  * ``fmnist_conv_16x16_8x16_b32`` (heldout suite): 16x16x1, channels (8, 16), batch 32: 1,418 params.
  * ``mnist_conv_16x16_8x16_layernorm_b32`` (heldout suite): MNIST digits, the same with a LayerNorm between each conv and its
    activation:
    1,466 params.
  * ``fmnist60k_conv_28x28_16x32x64x128_b32`` (test suite): the full Fashion-MNIST at 28x28x1, channels
    (16, 32, 64, 128), batch 32: 98,442 params.

Batches are ``{"image": f32[B, H, W, C], "label": i32[B]}``; the loss is the mean softmax cross-entropy, the aux
output holds the accuracy, and `normalizer` divides by ``log(num_classes)`` (chance level -> 1.0).
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

from metafam.datasets.base import Datasets
from metafam.datasets.cifar import cifar10_datasets
from metafam.datasets.images import fashion_mnist_datasets
from metafam.tasks._nn import activation_by_name
from metafam.tasks.image_mlp import NORMS, ImageClassifierTask, normalization_layer

Activation = Callable[[jax.Array], jax.Array]


def select_activation(activations: Sequence[Activation], index=0) -> Activation:
  """The activation ``activations[index]``; with several, dispatched by `jax.lax.switch` (``index`` may be traced)."""
  activations = tuple(activations)
  if len(activations) == 1:
    return activations[0]
  return lambda v: jax.lax.switch(index, activations, v)


def smoothed_cross_entropy(logits: jax.Array, labels: jax.Array, smoothing=0.0) -> jax.Array:
  """Mean cross-entropy of ``logits f32[..., K]`` against ``labels i32[...]`` smoothed towards uniform.

  The target puts ``1 - smoothing`` on the label and ``smoothing / K`` on every class; ``smoothing`` may be traced.
  """
  logp = jax.nn.log_softmax(logits)
  nll = -jnp.take_along_axis(logp, labels[..., None], axis=-1)[..., 0]
  return jnp.mean((1.0 - smoothing) * nll - smoothing * jnp.mean(logp, axis=-1))


def conv2d_same(x: jax.Array, w: jax.Array, stride: int = 1) -> jax.Array:
  """A 2-D convolution with SAME padding as one matrix product: ``x f32[B, H, W, C]``, ``w f32[k, k, C, O]`` ->
  ``f32[B, ceil(H / stride), ceil(W / stride), O]``.

  The same function as ``jax.lax.conv_general_dilated(x, w, (stride, stride), "SAME", ("NHWC", "HWIO", "NHWC"))``
  (padding split as XLA splits it, the odd pixel after), written as the ``k * k`` strided slices of the padded input
  concatenated along the channels (im2col) times ``w`` reshaped to ``[k * k * C, O]``. Why: XLA's CPU backend runs a
  convolution inside a loop (``lax.scan``, so every training run) several times slower than called alone, and this
  form does not pay that cost (measured with ``benchmarks/conv_in_loop.py``: ``docs/performance/inner-loop.md``).
  Only float rounding differs from the convolution.
  """
  k = w.shape[0]
  if w.ndim != 4 or w.shape[1] != k or w.shape[2] != x.shape[-1]:
    raise ValueError(f"w must be [k, k, {x.shape[-1]}, out] for x of shape {x.shape}, got {w.shape}.")
  _, height, width, channels = x.shape
  out_h, out_w = -(-height // stride), -(-width // stride)
  pad_h = max((out_h - 1) * stride + k - height, 0)
  pad_w = max((out_w - 1) * stride + k - width, 0)
  padded = jnp.pad(x, ((0, 0), (pad_h // 2, pad_h - pad_h // 2), (pad_w // 2, pad_w - pad_w // 2), (0, 0)))
  span_h, span_w = (out_h - 1) * stride + 1, (out_w - 1) * stride + 1
  patches = jnp.concatenate([padded[:, i:i + span_h:stride, j:j + span_w:stride, :]
                             for i in range(k) for j in range(k)], axis=-1)
  return patches @ w.reshape(k * k * channels, w.shape[-1])


class Conv2D(hk.Module):
  """``hk.Conv2D`` with SAME padding and a square kernel, computed by `conv2d_same`.

  Its parameters are ``hk.Conv2D``'s: the same names, shapes and initializers (``w``: truncated normal with standard
  deviation ``1 / sqrt(k * k * C)`` unless ``w_init``; ``b``: zeros), so a model keeps its parameters when it
  switches.
  """

  def __init__(self, output_channels: int, kernel_size: int, stride: int = 1, w_init=None,
               name: Optional[str] = None):
    super().__init__(name=name)
    self.output_channels, self.kernel_size, self.stride, self.w_init = output_channels, kernel_size, stride, w_init

  def __call__(self, x: jax.Array) -> jax.Array:
    k, channels = self.kernel_size, x.shape[-1]
    w_init = self.w_init or hk.initializers.TruncatedNormal(stddev=1.0 / np.sqrt(k * k * channels))
    w = hk.get_parameter("w", (k, k, channels, self.output_channels), x.dtype, init=w_init)
    b = hk.get_parameter("b", (self.output_channels,), x.dtype, init=jnp.zeros)
    return conv2d_same(x, w, self.stride) + b


def conv_forward(channels: Sequence[int], num_classes: int, activations: Sequence[Activation],
                 kernel_size=3, strides: Optional[Sequence[int]] = None, norm: Optional[str] = None,
                 pool: str = "avg", w_init=None, norm_before_activation: bool = False) -> hk.Transformed:
  """A haiku conv net ``forward(images f32[B, H, W, C], activation_index=0) -> logits f32[B, num_classes]``.

  Each layer is ``Conv2D(SAME padding) -> activation -> norm`` (`Conv2D`: haiku's parameters, `conv2d_same`'s
  arithmetic); then a global ``pool`` ("avg" or "max") and a
  Linear. ``strides`` (default: 2 for every layer) sets each conv's stride; a side shrinks as ``ceil(side /
  stride)``. ``norm`` is one of `metafam.tasks.image_mlp.NORMS` (with "batch_norm" the result is an
  ``hk.TransformedWithState``); norms add ``2 * c`` parameters per layer. With several ``activations`` the int32
  ``activation_index`` picks one via `jax.lax.switch` (may be a vmapped config leaf). ``kernel_size`` is one side
  for every layer or one per layer; ``w_init`` initializes the conv kernels (haiku's default if None).
  ``norm_before_activation`` puts the norm between the conv and its activation instead (``Conv2D -> norm ->
  activation``, as in the heldout suite's ``mnist_conv_16x16_8x16_layernorm_b32``).
  """
  channels = tuple(int(c) for c in channels)
  kernels = (kernel_size,) * len(channels) if isinstance(kernel_size, int) else tuple(kernel_size)
  if len(kernels) != len(channels):
    raise ValueError(f"kernel_size must be one size or one per conv layer ({len(channels)}), got {kernel_size!r}.")
  strides = (2,) * len(channels) if strides is None else tuple(int(s) for s in strides)
  if len(strides) != len(channels):
    raise ValueError(f"strides must give one stride per conv layer ({len(channels)}), got {strides!r}.")
  if pool not in ("avg", "max"):
    raise ValueError(f"pool must be 'avg' or 'max', got {pool!r}.")
  if norm not in NORMS:
    raise ValueError(f"norm must be one of {NORMS}, got {norm!r}.")

  def forward(images, activation_index=0):
    act = select_activation(activations, activation_index)
    x = images
    for i, (c, k, s) in enumerate(zip(channels, kernels, strides)):
      x = Conv2D(c, k, stride=s, w_init=w_init, name=f"conv_{i}")(x)
      norm_layer = normalization_layer(norm, f"norm_{i}")
      x = act(norm_layer(x)) if norm_before_activation else norm_layer(act(x))
    x = jnp.mean(x, axis=(1, 2)) if pool == "avg" else jnp.max(x, axis=(1, 2))
    return hk.Linear(num_classes, name="logits")(x)

  return hk.without_apply_rng(hk.transform_with_state(forward) if norm == "batch_norm" else hk.transform(forward))


def conv_num_params(in_channels: int, channels: Sequence[int], num_classes: int, kernel_size: int = 3) -> int:
  """The documented parameter count of `conv_forward` (see the module docstring)."""
  widths = (in_channels,) + tuple(channels)
  return sum((kernel_size * kernel_size * a + 1) * b for a, b in zip(widths[:-1], widths[1:])) + \
      (widths[-1] + 1) * num_classes


class ConvTask(ImageClassifierTask):
  """A small conv-net classifier (`conv_forward`) on an image `Datasets`.

  Args:
    channels: output channels of the conv layers (each stride 2).
    activation: a name from `metafam.tasks._nn.ACTIVATIONS`.
    kernel_size: square kernel side.
    datasets: the data; defaults to the embedded Fashion-MNIST at ``image_size`` with ``in_channels`` channels.
    image_size, in_channels, batch_size: used only to build the default datasets.
    norm: None, or ``"layer_norm"`` for a LayerNorm between every conv and its activation (`conv_forward` with
      ``norm_before_activation=True``; batch norm, which needs a model state, is not offered here).

  Parameter count: `conv_num_params` (plus ``2 * sum(channels)`` with a LayerNorm) (registered configs in the module
  docstring).
  """

  def __init__(self, channels: Sequence[int] = (16, 32), activation: str = "relu", kernel_size: int = 3,
               datasets: Optional[Datasets] = None, image_size: int = 16, in_channels: int = 1,
               batch_size: int = 128, name: Optional[str] = None, norm: Optional[str] = None):
    self.datasets = datasets if datasets is not None else fashion_mnist_datasets(batch_size, image_size,
                                                                                 channels=in_channels)
    self.channels = tuple(int(c) for c in channels)
    self.activation = activation
    self.num_classes = int(self.datasets.extra_info.get("num_classes", 10))
    if norm not in (None, "layer_norm"):
      raise ValueError(f"norm must be None or 'layer_norm', got {norm!r}.")
    self.norm = norm
    self.net = conv_forward(self.channels, self.num_classes, [activation_by_name(activation)], kernel_size,
                            norm=norm, norm_before_activation=True)
    shape = self.datasets.abstract_batch["image"].shape
    self.name = name or f"Conv_{'x'.join(map(str, shape[1:]))}_{'x'.join(map(str, self.channels))}"



def cifar10_conv_task(data_dir: Optional[str] = None, channels: Sequence[int] = (16, 32, 64),
                      activation: str = "relu", batch_size: int = 128, normalization: str = "unit") -> ConvTask:
  """`ConvTask` on real CIFAR-10 (32x32x3) read from ``data_dir`` or ``$METAFAM_CIFAR10_DIR``.

  With the default channels it has 24,234 params, like the registered CIFAR-shaped ``fmnist_conv_32x32x3_16x32x64``.
  """
  datasets = cifar10_datasets(batch_size, 32, normalization, data_dir=data_dir)
  return ConvTask(channels, activation, datasets=datasets,
                  name=f"cifar10_conv_32x32x3_{'x'.join(str(int(c)) for c in channels)}")
