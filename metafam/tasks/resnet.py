"""ResNets (dm-haiku): `hk.nets.ResNet` with a configurable stem, an optional stem max-pool and activation.

`ResNet` is haiku's ResNet (v1 or v2 blocks, bottleneck or not, batch norm with decay 0.9) whose initial conv
(``initial_conv_channels`` x ``initial_conv_kernel_size``^2, stride ``initial_conv_stride``, no bias) and stem
max-pool (3x3, stride 2; ``max_pool=False`` skips it) are arguments, and whose stem / final activation is
``act_fn`` (the blocks use ReLU, as in haiku). `resnet_num_params` gives the parameter count of the v2
bottleneck network (the configuration the reference's ResNet tasks use):

  stem ``k*k*C*c_0``; per group g with width c (``b = c / 4``) and input width c_in, the first block
  ``2*c_in + c_in*b + 2*b + 9*b*b + 2*b + b*c`` plus ``c_in*c`` with a projection, each further block the same
  with ``c_in = c``; final batch norm ``2*c_last``; logits ``(c_last + 1) * K``.
"""

from __future__ import annotations

from typing import Callable, Mapping, Optional, Sequence

import haiku as hk
import jax
import jax.numpy as jnp

BlockV1 = hk.nets.ResNet.BlockV1
BlockV2 = hk.nets.ResNet.BlockV2
BlockGroup = hk.nets.ResNet.BlockGroup


def check_length(length: int, value: Sequence, name: str) -> None:
  """ValueError unless ``value`` has ``length`` entries."""
  if len(value) != length:
    raise ValueError(f"`{name}` must be of length {length}, not {len(value)}.")


class ResNet(hk.nets.ResNet):
  """`hk.nets.ResNet` with ``initial_conv_*``, ``max_pool`` and ``act_fn`` arguments (see the module docstring)."""

  def __init__(self, blocks_per_group: Sequence[int], num_classes: int, bn_config: Optional[Mapping] = None,
               resnet_v2: bool = False, bottleneck: bool = True,
               channels_per_group: Sequence[int] = (256, 512, 1024, 2048),
               use_projection: Sequence[bool] = (True, True, True, True), logits_config: Optional[Mapping] = None,
               initial_conv_channels: int = 64, initial_conv_kernel_size: int = 7, initial_conv_stride: int = 2,
               max_pool: bool = True, act_fn: Callable[[jax.Array], jax.Array] = jax.nn.relu,
               name: Optional[str] = None):
    check_length(4, use_projection, "use_projection")
    super().__init__(blocks_per_group, num_classes, bn_config, resnet_v2, bottleneck, channels_per_group,
                     use_projection, logits_config, name,
                     initial_conv_config={"output_channels": initial_conv_channels,
                                          "kernel_shape": initial_conv_kernel_size, "stride": initial_conv_stride})
    self.max_pool, self.act_fn = max_pool, act_fn

  def __call__(self, inputs, is_training, test_local_stats=False):
    out = self.initial_conv(inputs)
    if not self.resnet_v2:
      out = self.act_fn(self.initial_batchnorm(out, is_training, test_local_stats))
    if self.max_pool:
      out = hk.max_pool(out, window_shape=(1, 3, 3, 1), strides=(1, 2, 2, 1), padding="SAME")
    for group in self.block_groups:
      out = group(out, is_training, test_local_stats)
    if self.resnet_v2:
      out = self.act_fn(self.final_batchnorm(out, is_training, test_local_stats))
    return self.logits(jnp.mean(out, axis=(1, 2)))


def resnet_num_params(in_channels: int, num_classes: int, blocks_per_group: Sequence[int],
                      channels_per_group: Sequence[int], use_projection: Sequence[bool], initial_conv_channels: int,
                      initial_conv_kernel_size: int) -> int:
  """Parameters of a v2 bottleneck `ResNet` (formula in the module docstring)."""
  total = initial_conv_kernel_size ** 2 * in_channels * initial_conv_channels
  c_in = initial_conv_channels
  for blocks, c, projection in zip(blocks_per_group, channels_per_group, use_projection):
    b = c // 4
    for i in range(blocks):
      total += 2 * c_in + c_in * b + 2 * b + 9 * b * b + 2 * b + b * c + (c_in * c if i == 0 and projection else 0)
      c_in = c
  return total + 2 * c_in + (c_in + 1) * num_classes
