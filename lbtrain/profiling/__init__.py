"""Profiling: measure how fast each replica trains the workload.

What balancing would buy, given the measurements, is lbtrain.report's business.
"""

from lbtrain.profiling.fit import LinearFit, fit_step_time
from lbtrain.profiling.memory import CapResult, probe_cap
from lbtrain.profiling.profiler import ProfileConfig, profile_all, profile_replica
from lbtrain.profiling.record import (
    ProfileFileError,
    ReplicaProfile,
    load_profiles,
    save_profiles,
)
from lbtrain.profiling.retime import add_measurement, outside_measured, retime_profiles
from lbtrain.profiling.state import TrainingState
from lbtrain.profiling.sync import comm_cost, time_sync

__all__ = [
    "CapResult",
    "LinearFit",
    "ProfileConfig",
    "ProfileFileError",
    "ReplicaProfile",
    "TrainingState",
    "add_measurement",
    "comm_cost",
    "fit_step_time",
    "load_profiles",
    "outside_measured",
    "probe_cap",
    "profile_all",
    "profile_replica",
    "retime_profiles",
    "save_profiles",
    "time_sync",
]
