"""`learned_optimization.tasks.fixed.all`: every fixed task, and ``FIXED_TASKS``, the table of their names.

``FIXED_TASKS`` maps each reference fixed-task name to its zero-argument constructor; it is what
`tasks.base.get_task_from_name` (the reference's gin lookup) reads. Besides the reference's ``all`` it holds the
ViT, MLP-Mixer and learned-optimizer (`lopt`) tasks (the reference registers them with gin when their modules are
imported). Building a task never reads data: datasets
metafam cannot serve offline raise `DatasetUnavailableError` only when a batch is requested.
"""

from __future__ import annotations

from metafam.compat.learned_optimization.tasks.fixed import (conv, es_wrapped, image_mlp, image_mlp_ae, lopt,
                                                             mlp_mixer, resnet, rnn_lm, transformer_lm, vit)

_MODULES = (conv, image_mlp, image_mlp_ae, resnet, rnn_lm, es_wrapped, lopt, transformer_lm, mlp_mixer, vit)

FIXED_TASKS = {name: getattr(module, name) for module in _MODULES for name in module.TASKS}

# Like the reference's `from ...fixed.<module> import *` lines: every public name of the task modules (their type
# aliases and helpers such as `rnn_lm.softmax_cross_entropy` too), the tasks included.
_EXPORTS = {name: value for module in _MODULES for name, value in vars(module).items()
            if not name.startswith("_") and not isinstance(value, type(conv)) and name not in ("annotations", "TASKS")}
_EXPORTS.update(FIXED_TASKS)
__all__ = sorted(_EXPORTS) + ["FIXED_TASKS"]

globals().update(_EXPORTS)
