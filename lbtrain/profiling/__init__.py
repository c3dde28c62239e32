"""Profiling: measure how fast each replica trains the workload, and report what balancing buys."""

from lbtrain.profiling.fit import LinearFit, fit_step_time
from lbtrain.profiling.memory import CapResult, probe_cap
from lbtrain.profiling.profiler import ProfileConfig, profile_all, profile_replica
from lbtrain.profiling.record import (
    ProfileFileError,
    ReplicaProfile,
    load_profiles,
    save_profiles,
)
from lbtrain.profiling.report import BalanceReport, build_report, format_report, plot_report
from lbtrain.profiling.retime import add_measurement, outside_measured, retime_profiles
from lbtrain.profiling.state import TrainingState
from lbtrain.profiling.sync import comm_cost, time_sync

__all__ = [
    "BalanceReport",
    "CapResult",
    "LinearFit",
    "ProfileConfig",
    "ProfileFileError",
    "ReplicaProfile",
    "TrainingState",
    "add_measurement",
    "build_report",
    "comm_cost",
    "fit_step_time",
    "format_report",
    "load_profiles",
    "outside_measured",
    "plot_report",
    "probe_cap",
    "profile_all",
    "profile_replica",
    "retime_profiles",
    "save_profiles",
    "time_sync",
]
