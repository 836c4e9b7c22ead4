"""Part of `metafam.compat.learned_optimization`; see that package."""
