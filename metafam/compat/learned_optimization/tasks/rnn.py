"""`learned_optimization.tasks.rnn`: `IRNN`, the identity-initialized ReLU RNN core (metafam's
`metafam.tasks.language.IRNN`)."""

from metafam.tasks.language import IRNN

__all__ = ["IRNN"]
