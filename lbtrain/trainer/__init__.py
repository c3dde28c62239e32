"""The synchronous, load-balanced trainer: `train(config, comm)` runs one whole job."""

from lbtrain.trainer.config import TrainConfig, load_toml, save_toml
from lbtrain.trainer.job import TrainResult, train
from lbtrain.trainer.loop import TrainingDiverged, fit

__all__ = [
    "TrainConfig",
    "TrainResult",
    "TrainingDiverged",
    "fit",
    "load_toml",
    "save_toml",
    "train",
]
