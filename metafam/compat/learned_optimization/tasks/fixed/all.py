"""`learned_optimization.tasks.fixed.all`: every fixed task, and ``FIXED_TASKS``, the table of their names.

``FIXED_TASKS`` maps each reference fixed-task name to its zero-argument constructor; it is what
`tasks.base.get_task_from_name` (the reference's gin lookup) reads. Building a task never reads data: datasets
metafam cannot serve offline raise `DatasetUnavailableError` only when a batch is requested.
"""

from __future__ import annotations

from metafam.compat.learned_optimization.tasks.fixed import (conv, es_wrapped, image_mlp, image_mlp_ae, rnn_lm,
                                                             transformer_lm)

_MODULES = (conv, image_mlp, image_mlp_ae, rnn_lm, es_wrapped, transformer_lm)

FIXED_TASKS = {name: getattr(module, name) for module in _MODULES for name in module.TASKS}

__all__ = list(FIXED_TASKS) + ["FIXED_TASKS"]

globals().update(FIXED_TASKS)
