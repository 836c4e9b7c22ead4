"""Writes a meta-train run's theta as shipped pretrained weights (metafam/pretrained/data/<name>.npz).

    python experiments/export_pretrained.py runs/generalist/checkpoint.npz --name generalist_v1
    python experiments/export_pretrained.py runs/generalist_v2/checkpoint.npz --name generalist_v2
    python experiments/export_pretrained.py RUN/checkpoint.npz --candidate --out theta.npz   # any run, not shipped

The file holds only theta (float32) and a JSON header naming the optimizer, the recipe, the meta-steps and the
licence; `metafam.pretrained.load` checks its structure against the registered optimizer. A shipped entry's run must
have been trained by the entry's shipped recipe: the checkpoint's recorded recipe is compared field by field with it
(less its name, description and length: a run may be stopped before its last meta-step). With ``--candidate`` the
run needs no entry in `metafam.pretrained.PRETRAINED`: the theta of a candidate (e.g. one meta-trained on a lent GPU,
whose full checkpoint, every lane's task state included, is too large to bring back) goes to ``--out``, readable by
`metafam.benchmark.runner.load_theta` and `experiments/heldout_learned.py --checkpoint`.
"""
import argparse
import os

import jax

import metafam.pretrained as pretrained
from metafam.benchmark.runner import load_theta
from metafam.runs import checkpoint
from metafam.runs.recipes import Recipe, load_recipe


def trained_by(recorded: dict, recipe_name: str) -> bool:
  """Whether ``recorded`` (a checkpoint's recipe) is the shipped recipe ``recipe_name``, up to name, description and
  length (`Recipe.identity`)."""
  try:
    return Recipe.from_identity(recorded, recipe_name).identity(0) == load_recipe(recipe_name).identity(0)
  except (TypeError, ValueError):  # not a recipe at all
    return False


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("checkpoint", help="a `metafam meta-train --recipe` checkpoint")
  p.add_argument("--name", default="generalist_v1", help="the entry of metafam.pretrained.PRETRAINED to write")
  p.add_argument("--out", default=None, help="the file to write (default: the entry's shipped weights file)")
  p.add_argument("--candidate", action="store_true",
                 help="export any run's theta to --out, without an entry of metafam.pretrained (not shipped)")
  args = p.parse_args()
  if args.candidate and not args.out:
    p.error("--candidate needs --out (a candidate is not written over shipped weights)")
  config = checkpoint.read_metadata(args.checkpoint).get("config") or {}
  recipe = config.get("recipe") or {}
  if args.candidate:
    name, optimizer, card = None, recipe.get("optimizer") or config.get("optimizer"), None
  else:
    entry = pretrained.info(args.name)
    if recipe.get("optimizer") != entry.optimizer or not trained_by(recipe, entry.recipe):
      raise SystemExit(f"{args.checkpoint} was not trained by recipe {entry.recipe!r} with {entry.optimizer}.")
    name, optimizer, card = args.name, entry.optimizer, entry.model_card
    recipe = dict(recipe, name=entry.recipe)  # a run of a recipe file records no name
  theta = load_theta(args.checkpoint)
  header = checkpoint.read_header(args.checkpoint)
  meta_steps = int(checkpoint.read(args.checkpoint)[1]["step"]) if header.root_class == "MetaTrainState" else None
  metadata = {"name": name, "optimizer": optimizer, "recipe": recipe, "seed": config.get("seed"),
              "meta_steps": meta_steps, "license": "Apache-2.0", "model_card": card}
  out = args.out or entry.weights_path
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  checkpoint.save(out, jax.tree.map(lambda x: x.astype("float32"), theta), metadata)
  if not args.candidate and out == entry.weights_path:
    pretrained.load(args.name)  # the shipped file loads and matches the optimizer's structure
  elif jax.tree.structure(load_theta(out)) != jax.tree.structure(theta):
    raise SystemExit(f"{out}: the written theta does not read back with the checkpoint's structure.")
  print(f"wrote {out} ({os.path.getsize(out):,} bytes, meta-step {meta_steps})")


if __name__ == "__main__":
  main()
