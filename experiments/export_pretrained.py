"""Writes a meta-train run's theta as shipped pretrained weights (metafam/pretrained/data/<name>.npz).

    python experiments/export_pretrained.py runs/generalist/checkpoint.npz --name generalist_v1

The file holds only theta (float32) and a JSON header naming the optimizer, the recipe, the meta-steps and the
licence; `metafam.pretrained.load` checks its structure against the registered optimizer.
"""
import argparse
import os

import jax

import metafam.pretrained as pretrained
from metafam.benchmark.runner import load_theta
from metafam.outer_trainers import checkpoint


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("checkpoint", help="a `metafam meta-train --recipe` checkpoint")
  p.add_argument("--name", default="generalist_v1", help="the entry of metafam.pretrained.PRETRAINED to write")
  p.add_argument("--out", default=None, help="the file to write (default: the entry's shipped weights file)")
  args = p.parse_args()
  entry = pretrained.info(args.name)
  config = checkpoint.read_metadata(args.checkpoint).get("config") or {}
  recipe = config.get("recipe") or {}
  if recipe.get("name") != entry.recipe or recipe.get("optimizer") != entry.optimizer:
    raise SystemExit(f"{args.checkpoint} was not trained by recipe {entry.recipe!r} with {entry.optimizer}.")
  theta = load_theta(args.checkpoint)
  header = checkpoint.read_header(args.checkpoint)
  meta_steps = int(checkpoint.read(args.checkpoint)[1]["step"]) if header.root_class == "MetaTrainState" else None
  metadata = {"name": args.name, "optimizer": entry.optimizer, "recipe": recipe, "seed": config.get("seed"),
              "meta_steps": meta_steps, "license": "Apache-2.0", "model_card": entry.model_card}
  out = args.out or entry.weights_path
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  checkpoint.save(out, jax.tree.map(lambda x: x.astype("float32"), theta), metadata)
  if out == entry.weights_path:
    pretrained.load(args.name)  # the shipped file loads and matches the optimizer's structure
  elif jax.tree.structure(load_theta(out)) != jax.tree.structure(theta):
    raise SystemExit(f"{out}: the written theta does not read back with the checkpoint's structure.")
  print(f"wrote {out} ({os.path.getsize(out):,} bytes, meta-step {meta_steps})")


if __name__ == "__main__":
  main()
