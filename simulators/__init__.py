"""Simulator adapters (import package `simulators`).

Every simulator implements the contract in `simulators.base` and passes
`simulators.check.check_simulator`. Built-ins register lazily in `mmrl.registry.SIMULATORS`, so
importing this package never imports a heavy simulator dependency.
"""

from mmrl.registry import SIMULATORS

from .base import Observation, Simulator, StepResult
from .check import check_simulator

SIMULATORS.register(
    "reach",
    "simulators.reach:ReachSim",
    description="embedded pure-torch batched reach-the-named-target task (RGB + instruction)",
)

__all__ = ["Observation", "StepResult", "Simulator", "check_simulator"]
