"""`learned_optimization.tasks.fixed.vit_test`: the reference's smoke test of its ViT tasks, importable as research
code imports it (to subclass `VITTest` or run it on its own tasks).

`VITTest.test_tasks(task_name)` runs `tasks.test_utils.smoketest_task` on ``vit.<task_name>()`` (zeros shaped like the
task's ``abstract_batch``: these tasks' datasets are not available offline), parameterized over ``tasks``, the
reference's six ViT task names, with absl's ``parameterized`` as the reference does.
"""

from __future__ import annotations

from absl.testing import absltest, parameterized

from metafam.compat.learned_optimization.tasks import test_utils
from metafam.compat.learned_optimization.tasks.fixed import vit

__all__ = ["VITTest", "tasks"]

tasks = [
    "VIT_ImageNet64_wideshallow",
    "VIT_ImageNet64_skinnydeep",
    "VIT_Cifar100_wideshallow",
    "VIT_Cifar100_skinnydeep",
    "VIT_Food101_64_wideshallow",
    "VIT_Food101_64_skinnydeep",
]


class VITTest(parameterized.TestCase):
  """Builds each ViT task of ``tasks`` and smoke-tests it (init, every loss variant, gradient, normalizer)."""

  @parameterized.parameters(tasks)
  def test_tasks(self, task_name):
    test_utils.smoketest_task(getattr(vit, task_name)())


if __name__ == "__main__":
  absltest.main()
