"""`learned_optimization.research.general_lopt.tasks.parametric`: VeLO's two meta-training task distributions.

``phase_one_distribution(key)`` and ``phase_two_distribution(key)`` draw a compute budget, then a parametric task
family with the reference's *timed* samplers (``timed_sample_image_mlp`` and the others), which rejection-sample
configurations under that budget with learned runtime models. Those models are files of the reference's cloud
storage that metafam does not have offline (see `tasks.parametric.parametric_utils.timed_sampler_unavailable`), so
both functions raise NotImplementedError naming the untimed samplers (`tasks.parametric.*.sample_*`) to build a
distribution from instead. They keep the reference's signatures so that code importing them loads.
"""

from __future__ import annotations

from metafam.compat.learned_optimization.tasks import base as tasks_base
from metafam.compat.learned_optimization.tasks.parametric import parametric_utils as pu

PRNGKey = tasks_base.PRNGKey


def phase_one_distribution(key: PRNGKey) -> tasks_base.TaskFamily:
  """VeLO's first-phase distribution (image MLPs, conv nets, autoencoders, VAEs, ViTs under small budgets)."""
  pu.timed_sampler_unavailable("phase_one_distribution", "the tasks.parametric sample_* functions")


def phase_two_distribution(key: PRNGKey) -> tasks_base.TaskFamily:
  """VeLO's second-phase distribution (phase one's families plus RNN / transformer LMs, ResNets and learned-optimizer
  tasks, larger budgets, with weight reparameterization augmentation)."""
  pu.timed_sampler_unavailable("phase_two_distribution", "the tasks.parametric sample_* functions")
