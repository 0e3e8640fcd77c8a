"""Moved: the simulator contract is `mmrl.simulator`. This alias keeps adapters written against
``simulators.base`` and checkpoints pickled before the move (fixed-length rollouts stored an
`Observation`) loading."""

from mmrl.simulator import Observation, Simulator, StepResult, reset_seeds  # noqa: F401
