"""The synchronous, load-balanced trainer: `train(config, comm)` runs one whole job."""

from lbtrain.trainer.config import TrainConfig, load_toml, save_toml
from lbtrain.trainer.engine import Callback, Engine, RunState, StepTimer, TrainingDiverged
from lbtrain.trainer.job import TrainResult, train

__all__ = [
    "Callback",
    "Engine",
    "RunState",
    "StepTimer",
    "TrainConfig",
    "TrainResult",
    "TrainingDiverged",
    "load_toml",
    "save_toml",
    "train",
]
