"""Meta-training recipes: the shipped generalist recipe as data, bad recipes, and `metafam meta-train --recipe`
(mixture of families, resume bit-identical, run identity)."""

import dataclasses
import json
import os
import re

import numpy as np
import pytest

from metafam import cli
from metafam.benchmark.suites import HORIZONS
from metafam.runs import CheckpointError, checkpoint
from metafam.runs.recipes import Recipe, load_recipe
from metafam.taskfamilies.spec import FamilySpec

TINY_RECIPE = {
    "name": "tiny", "optimizer": "adafac_muon_rms_lopt", "step_mult": 0.05, "estimator": "nres", "num_tasks": 2,
    "unroll_length": 3, "trajectory_lengths": [5, 12], "sigma": 0.05, "meta_learning_rate": 0.01,
    "meta_lr_decay_steps": 0, "clip_grad_norm": 1.0, "num_steps": 4,
    "families": [{"kind": "quadratic", "kwargs": {"dim": 4}}, {"kind": "quadratic", "kwargs": {"dim": 7}}]}
FLAGS = ["--eval_tasks=2", "--eval_steps=5", "--checkpoint_every=1", "--progress=false"]


@pytest.fixture(autouse=True)
def _no_persistent_cache(monkeypatch):
  monkeypatch.setenv("METAFAM_JAX_CACHE", "")


def run(args, capsys):
  code = cli.main(["metafam"] + args)
  out = capsys.readouterr()
  return code, out.out, out.err


def write_recipe(path, **changes):
  with open(path, "w") as f:
    json.dump(dict(TINY_RECIPE, **changes), f)
  return str(path)


def test_the_ablation_recipes_in_experiments_load_and_differ_from_generalist_only_where_they_say():
  """``experiments/recipes/*.json``: the generalist recipe plus one change each (the docs' ablation rows)."""
  base = load_recipe("generalist").to_dict()
  folder = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "experiments",
                        "recipes")
  changed = {}
  for name in sorted(os.listdir(folder)):
    recipe = load_recipe(os.path.join(folder, name)).to_dict()
    changed[name] = sorted(k for k in recipe if recipe[k] != base[k] and k not in ("name", "description"))
  assert changed == {"generalist_reparam.json": ["families"]}
  reparam = load_recipe(os.path.join(folder, "generalist_reparam.json"))
  plain = [dataclasses.replace(f, augmentations=()) for f in reparam.families]
  assert plain == list(load_recipe("generalist").families)
  for family in reparam.families:
    assert family.augmentations == (("reparam", {"log_scale_range": (-2.302585, 2.302585)}),)


def test_the_generalist_recipe_mixes_families_unlike_the_heldout_tasks():
  recipe = load_recipe("generalist")
  assert len(recipe.families) >= 4 and len({f.kind for f in recipe.families}) >= 3
  heldout_sizes = {int(m.group(1)) for m in map(re.compile(r"_(\d+)x\1_").search, HORIZONS) if m}
  assert heldout_sizes == {16, 28}  # the suite's image sizes (and text): the recipe's families use others
  assert all(f.kwargs["image_size"] not in heldout_sizes for f in recipe.families)
  # Trajectories as long as the suite's horizons (200 to 2,000 inner steps).
  assert recipe.trajectory_lengths[0] <= min(HORIZONS.values()) and recipe.trajectory_lengths[1] >= max(
      HORIZONS.values())
  lopt = recipe.build_learned_optimizer()
  assert lopt.unit_rms_step and lopt.time_scales == () and lopt.step_mult == recipe.step_mult


@pytest.mark.parametrize("changes, message", [
    (dict(optimizer="adam"), "Recipe.optimizer 'adam' is not a registered learned optimizer"),
    (dict(estimator="es"), "Recipe.estimator 'es' is not one of"),
    (dict(families=[]), "at least one family"),
    (dict(num_tasks=0), "Recipe.num_tasks must be a positive int"),
    (dict(sigma=float("nan")), "Recipe.sigma"),
    (dict(trajectory_lengths=[10, 5]), "LogUniformSchedule"),
    (dict(trajectory_lengths=[10]), "must be \\(low, high\\)"),
    (dict(colour="red"), "unknown recipe keys \\['colour'\\]"),
    (dict(optimizer="muon_residual_lopt", optimizer_kwargs={"lr_spread": 0.5}),
     "Recipe.optimizer_kwargs \\{'lr_spread': 0.5\\} for muon_residual_lopt: lr_spread must be a finite number >= 1"),
    (dict(optimizer_kwargs={"colour": 1}), "Recipe.optimizer_kwargs \\{'colour': 1\\} for adafac_muon_rms_lopt: .*colour"),
    (dict(optimizer_kwargs={"step_mult": 0.1}), "give step_mult as Recipe.step_mult"),
    (dict(optimizer_kwargs=[1]), "Recipe.optimizer_kwargs must be a mapping"),
    (dict(estimator_kwargs={"sigma": 0.1}), "Recipe.estimator_kwargs: sigma is set by the recipe's own fields"),
    (dict(estimator="full_es", estimator_kwargs={"trajectory_length": 9}), "trajectory_length is set by the recipe"),
    (dict(estimator_kwargs={"loss_type": "tail"}), "estimator nres takes no 'loss_type'; it takes clip_loss_diff, "),
    (dict(estimator_kwargs=[1]), "Recipe.estimator_kwargs must be a mapping"),
])
def test_bad_recipes_name_what_is_wrong(tmp_path, changes, message):
  with pytest.raises(ValueError, match=message):
    load_recipe(write_recipe(tmp_path / "r.json", **changes))


def test_optimizer_kwargs_reach_the_learned_optimizer_and_the_identity_only_when_given(tmp_path):
  plain = load_recipe(write_recipe(tmp_path / "a.json", optimizer="muon_residual_lopt"))
  spread = load_recipe(write_recipe(tmp_path / "b.json", optimizer="muon_residual_lopt",
                                    optimizer_kwargs={"lr_spread": 3.0}))
  assert plain.build_learned_optimizer().lr_spread == 1.0
  lopt = spread.build_learned_optimizer()
  assert lopt.lr_spread == 3.0 and lopt.step_mult == TINY_RECIPE["step_mult"]
  assert "optimizer_kwargs" not in plain.identity(0)["recipe"]  # as before the field existed: old runs resume
  assert spread.identity(0)["recipe"]["optimizer_kwargs"] == {"lr_spread": 3.0}
  assert spread.identity(0) != plain.identity(0)
  assert Recipe.from_dict(json.loads(json.dumps(spread.to_dict()))) == spread


def test_estimator_kwargs_reach_the_estimator_and_the_identity_only_when_given(tmp_path):
  plain = load_recipe(write_recipe(tmp_path / "a.json", estimator="full_es", trajectory_lengths=[30, 30]))
  tail = load_recipe(write_recipe(tmp_path / "b.json", estimator="full_es", trajectory_lengths=[30, 30],
                                  estimator_kwargs={"loss_type": "tail", "tail_fraction": 0.2}))
  assert "estimator_kwargs" not in plain.identity(0)["recipe"]  # as before the field existed: old runs resume
  assert tail.identity(0)["recipe"]["estimator_kwargs"] == {"loss_type": "tail", "tail_fraction": 0.2}
  for est in tail.build_estimators(tail.build_learned_optimizer()):  # one per family
    assert (est.loss_type, est.tail_steps, est.trajectory_length) == ("tail", 6, 30)
  assert {est.loss_type for est in plain.build_estimators(plain.build_learned_optimizer())} == {"avg"}
  assert Recipe.from_dict(json.loads(json.dumps(tail.to_dict()))) == tail


def test_unknown_recipe_and_bad_json(tmp_path):
  with pytest.raises(ValueError, match="unknown recipe \\(and no such JSON file\\) 'nope'; valid names: generalist"):
    load_recipe("nope")
  bad = tmp_path / "bad.json"
  bad.write_text("{not json")
  with pytest.raises(ValueError, match="is not valid JSON"):
    load_recipe(str(bad))


def test_build_gives_one_estimator_per_family():
  recipe = Recipe.from_dict(TINY_RECIPE)
  lopt, families, trainer = recipe.build()
  assert len(trainer.estimators) == 2 and [f.dim for f in families] == [4, 7]
  assert [e.step.family.dim for e in trainer.estimators] == [4, 7]
  # Per meta-step: per family 2 pairs = 4 lanes of 3 inner steps.
  assert trainer.inner_steps_per_meta_step == 2 * 4 * 3
  assert isinstance(recipe.families[0], FamilySpec)


@pytest.mark.slow  # resume is the run object's, one path for recipes and flags: test_a_run_started_by_an_earlier_
# metafam_resumes_exactly[flags] and test_failures.py's SIGTERM resume cover it bit for bit
def test_meta_train_recipe_resumes_bit_identically_and_reports_its_totals(tmp_path, capsys):
  path = write_recipe(tmp_path / "tiny.json")
  straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
  code, out, err = run(["meta-train", f"--recipe={path}", f"--output_dir={straight}"] + FLAGS, capsys)
  assert code == 0, err
  assert "meta-steps: 4" in out and "inner steps: 96 (24 per meta-step)" in out
  assert run(["meta-train", f"--recipe={path}", "--num_steps=2", f"--output_dir={resumed}"] + FLAGS, capsys)[0] == 0
  assert run(["meta-train", f"--recipe={path}", f"--output_dir={resumed}"] + FLAGS, capsys)[0] == 0
  thetas = [checkpoint.read(os.path.join(d, "checkpoint.npz"))[1]["theta"] for d in (straight, resumed)]
  flat = [np.concatenate([np.ravel(x) for x in (t["decay_logits"], *t["mlp"].values())]) for t in thetas]
  np.testing.assert_array_equal(flat[0], flat[1])
  with open(os.path.join(resumed, "summary.json")) as f:
    summary = json.load(f)
  assert summary["meta_steps"] == 4 and summary["inner_steps_total"] == 96
  assert summary["config"]["recipe"]["families"][1]["kwargs"]["dim"] == 7
  # `evaluate` rebuilds the optimizer with the recipe's step_mult (recorded inside the run's recipe).
  code, out, err = run(["evaluate", "--optimizer=adafac_muon_rms_lopt", f"--checkpoint={resumed}/checkpoint.npz",
                        "--task=quadratic_10", "--inner_steps=8", "--seeds=1", "--progress=false",
                        f"--output_dir={tmp_path / 'eval'}"], capsys)
  assert code == 0, err
  (built,) = cli.build_optimizers("adafac_muon_rms_lopt", learning_rate=1e-3,
                                  checkpoint=f"{resumed}/checkpoint.npz").values()
  assert built.lopt.step_mult == 0.05  # the library default is 1e-2
  # The recipe is the run's identity: the same directory with a changed recipe is refused; its description is prose.
  reworded = write_recipe(tmp_path / "reworded.json", description="the same run, described again")
  code, out, err = run(["meta-train", f"--recipe={reworded}", "--num_steps=5", f"--output_dir={resumed}"] + FLAGS,
                       capsys)
  assert code == 0 and "meta-steps: 5" in out, err
  other = write_recipe(tmp_path / "other.json", sigma=0.1)
  code, _, err = run(["meta-train", f"--recipe={other}", "--num_steps=5", f"--output_dir={resumed}"] + FLAGS,
                     capsys)
  assert code == 2 and "belongs to a different run" in err


def test_a_run_object_is_the_library_form_of_meta_train(tmp_path):
  """`MetaTrainingRun`: the recipe's identity is the checkpointed config, `run` trains to the recipe's length and
  returns the closing comparison and the files it wrote; another recipe in its directory is refused."""
  from metafam.runs import MetaTrainingRun
  from metafam.runs.run_dir import run_identity
  recipe = Recipe.from_dict(TINY_RECIPE)
  out = str(tmp_path / "run")
  built = MetaTrainingRun(recipe, out, seed=3, eval_tasks=2, eval_steps=5)
  stored = run_identity(built.trainer, built.identity)
  assert built.identity == recipe.identity(3) == {k: stored[k] for k in ("recipe", "seed")}
  assert built.identity["seed"] == 3 and "name" not in built.identity["recipe"]
  result = built.run(progress=False, checkpoint_every=2)
  assert result.meta_steps == 4 and result.totals["inner_steps_total"] == 96 and result.written[0] == "summary.json"
  assert set(result.comparison.learned) == {"learned (init)", "learned (final)"} and len(built.history()) == 4
  assert checkpoint.read_metadata(os.path.join(out, "checkpoint.npz"))["config"] == stored
  with pytest.raises(CheckpointError, match="belongs to a different run"):
    MetaTrainingRun(recipe.replace(sigma=0.1), out, seed=3, eval_tasks=2, eval_steps=5).run(progress=False)


@pytest.mark.parametrize("args, message", [
    (["--recipe=generalist", "--family=fmnist_mlp_family_8x8_32"], "--recipe sets the learned optimizer.*remove "
                                                                   "--family"),
    (["--recipe=generalist", "--estimator=pes", "--trajectory_length=50"], "remove --estimator, --trajectory_length"),
    (["--recipe=nope"], "--recipe nope: unknown recipe \\(and no such JSON file\\) 'nope'; valid names: generalist"),
])
def test_bad_recipe_flags_are_one_line_errors(tmp_path, capsys, args, message):
  out_dir = tmp_path / "run"
  code, _, err = run(["meta-train", f"--output_dir={out_dir}"] + args, capsys)
  assert code == 2 and err.startswith("metafam: error: ") and err.count("\n") == 1
  assert re.search(message, err), err
  assert not out_dir.exists()


def test_the_generalist_v2_candidate_recipes_avoid_the_test_tasks_and_c_changes_only_conv_kernels():
  """``experiments/generalist_v2``: the candidates meta-train at the test suite's sizes on none of its tasks (no
  family has a test task's layer sizes), and candidate c is candidate b plus the dev-chosen conv-kernel rule."""
  from metafam.tasks.registry import TEST_TASKS
  folder = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "experiments",
                        "generalist_v2")
  recipes = {n: load_recipe(os.path.join(folder, n)) for n in ("recipe_a.json", "recipe.json", "recipe_c.json")}
  test_tokens = {token for t in TEST_TASKS for token in t.split("_")}  # e.g. "128x128x128", "16x32x64x128"
  for recipe in recipes.values():
    for family in recipe.families:
      sizes = family.kwargs.get("hidden_sizes") or family.kwargs.get("channels") or [family.kwargs["hidden_size"]]
      assert "x".join(map(str, sizes)) not in test_tokens, (recipe.name, family)
  b, c = recipes["recipe.json"].to_dict(), recipes["recipe_c.json"].to_dict()
  assert sorted(k for k in b if b[k] != c[k]) == ["description", "name", "optimizer_kwargs"]
  assert c["optimizer_kwargs"] == dict(b["optimizer_kwargs"], conv_kernels="matrix")
  assert recipes["recipe_c.json"].build_learned_optimizer().conv_kernels == "matrix"


def test_meta_train_flag_defaults_are_the_main_job_recipe():
  """The defaults of ``metafam meta-train``'s flags come from one source: the flags that describe the run from
  `recipe_flags.main_job` (the recipe the command runs with no flags, the README's main job), the others from the
  defaults of `MetaTrainingRun` and its loop; so the command line and the library cannot drift apart."""
  import inspect

  from metafam._cli_spec import COMMANDS, FLAGS
  from metafam.runs.loop import DEFAULT_MAX_SKIPPED_STEPS
  from metafam.runs.recipe_flags import (FLAG_KEYS, flag_defaults, main_job, recipe_from_command,
                                                   recipe_from_flags)
  from metafam.runs.run import MetaTrainingRun
  main = main_job()
  run_flags = FLAG_KEYS + ("perturbation", "perturbation_rank", "num_steps")
  assert {name: FLAGS[name].default for name in run_flags} == flag_defaults(main)
  names = COMMANDS["meta-train"]["flags"]
  assert set(run_flags) <= set(names)
  assert recipe_from_command({n: FLAGS[n].default for n in names}, set()) == recipe_from_flags(flag_defaults(main))
  assert recipe_from_flags(flag_defaults(main)) == main
  # The main job's values (bit-identical runs of `metafam meta-train` with no flags), where they differ from Recipe's.
  assert (main.unroll_length, main.trajectory_lengths, main.meta_lr_decay_steps, main.num_steps) == (
      10, (200, 200), 6000, 6000)
  assert (main.optimizer, main.step_mult, main.estimator, main.num_tasks) == ("adafac_muon_mlp_lopt", 1e-2, "nres", 8)
  init = inspect.signature(MetaTrainingRun.__init__).parameters
  run = inspect.signature(MetaTrainingRun.run).parameters
  assert FLAGS["eval_tasks"].default == init["eval_tasks"].default
  assert FLAGS["eval_steps"].default == init["eval_steps"].default
  assert FLAGS["seed"].default == init["seed"].default
  assert FLAGS["checkpoint_every"].default == run["checkpoint_every"].default
  assert FLAGS["max_skipped_steps"].default == run["max_skipped_steps"].default == DEFAULT_MAX_SKIPPED_STEPS
