"""`learned_optimization.tasks.fixed`: named fixed tasks (`image_mlp`) over metafam's embedded data."""
