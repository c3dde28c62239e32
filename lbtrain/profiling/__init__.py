"""Profiling: measure how fast each replica trains the workload, and report what balancing buys."""

from lbtrain.profiling.fit import LinearFit, fit_step_time
from lbtrain.profiling.memory import CapResult, probe_cap
from lbtrain.profiling.profiler import ProfileConfig, TrainingState, profile_all, profile_replica
from lbtrain.profiling.record import (
    ProfileFileError,
    ReplicaProfile,
    load_profiles,
    save_profiles,
)
from lbtrain.profiling.report import BalanceReport, build_report, format_report, plot_report

__all__ = [
    "BalanceReport",
    "CapResult",
    "LinearFit",
    "ProfileConfig",
    "ProfileFileError",
    "ReplicaProfile",
    "TrainingState",
    "build_report",
    "fit_step_time",
    "format_report",
    "load_profiles",
    "plot_report",
    "probe_cap",
    "profile_all",
    "profile_replica",
    "save_profiles",
]
