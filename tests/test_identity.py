"""`metafam._identity`'s policy for compiled programs: an engine object's programs are its own (`own_program`), built
once on first use, reused by every later call, and gone with the object; shared programs' keys are tested with their
engines (tests/evaluation/test_evaluation.py, tests/evaluation/test_family_eval.py)."""

import gc
import logging
import weakref

import jax
import numpy as np

from meta_setup import build_trainer

from metafam._identity import own_program


def test_own_program_is_built_once_and_kept_on_the_object():
  class Obj:
    pass

  obj, builds = Obj(), []
  build = lambda: builds.append(1) or object()
  first = own_program(obj, "_prog", build)
  assert own_program(obj, "_prog", build) is first and obj.__dict__["_prog"] is first and len(builds) == 1
  assert own_program(Obj(), "_prog", build) is not first and len(builds) == 2  # another object, its own program


def test_engine_programs_are_reused_and_die_with_their_objects(caplog):
  trainer = build_trainer(num_tasks=2, unroll_length=2, trajectory=6)
  state = trainer.init(jax.random.key(0))
  state, _ = trainer.step(state)  # compiles the meta-step (and within it the estimate's unroll)
  step, estimator = trainer.estimators[0].step, trainer.estimators[0]
  step.init_step_state(trainer.learned_opt.init(jax.random.key(1)), jax.random.key(2))  # compiles the init
  programs = (trainer._step, step._init, step._unroll)
  assert all(a is b for a, b in zip((trainer._step, step._init, step._unroll), programs))  # built once each
  with caplog.at_level(logging.WARNING), jax.log_compiles():
    state, _ = trainer.step(state)
    step.init_step_state(trainer.learned_opt.init(jax.random.key(1)), jax.random.key(3))
  assert not [r.getMessage() for r in caplog.records if "Compiling" in r.getMessage()]
  refs = [weakref.ref(o) for o in (trainer, estimator, step, *programs)]
  del trainer, state, step, estimator, programs
  gc.collect()
  assert [r() for r in refs] == [None] * len(refs)


def test_a_copy_outlives_its_original():
  """`jax.tree.map` over an engine object makes a copy keyed by its own identity: it still runs after the original is
  gone, with the same numbers."""
  step = build_trainer(num_tasks=2, unroll_length=2, trajectory=6).estimators[0].step
  theta = step.learned_opt.init(jax.random.key(1))
  want = step.unroll(theta, step.init_step_state(theta, jax.random.key(2)), jax.random.key(3), 3)[1].loss
  copy = jax.tree.map(lambda x: x, step)
  ref = weakref.ref(step)
  del step
  gc.collect()
  assert ref() is None
  got = copy.unroll(theta, copy.init_step_state(theta, jax.random.key(2)), jax.random.key(3), 3)[1].loss
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
