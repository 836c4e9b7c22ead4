"""`learned_optimization.outer_train`: not provided (importing it raises ImportError)."""

from metafam.compat.learned_optimization import _unavailable

_unavailable.fail(__name__, "gin (LO's absl/gin launcher scripts for cluster meta-training)",
                  'For single-machine meta-training use '
                  'outer_trainers.gradient_learner.SingleMachineGradientLearner or the `metafam meta-train` '
                  'command.')
