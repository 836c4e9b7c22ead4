"""`learned_optimization.tasks.resnet`: the reference's ResNet modules, as metafam's `metafam.tasks.resnet`
(haiku's ResNet and blocks, with the reference's stem arguments ``initial_conv_*``, ``max_pool`` and ``act_fn``)."""

from typing import Union

from metafam.tasks.resnet import BlockGroup, BlockV1, BlockV2, ResNet, check_length

FloatStrOrBool = Union[str, float, bool]

__all__ = ["FloatStrOrBool", "BlockV1", "BlockV2", "BlockGroup", "ResNet", "check_length"]
