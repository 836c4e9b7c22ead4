"""Training: a high-level `Trainer` with callbacks, early stopping, keep-best params and ensembles."""

from metafam.training.callbacks import Callback, EarlyStopping
from metafam.training.trainer import History, Trainer, TrainResult

__all__ = ["Callback", "EarlyStopping", "History", "Trainer", "TrainResult"]
