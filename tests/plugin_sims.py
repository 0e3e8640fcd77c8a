"""Simulators a user might write (outside mmrl's adapters), broken the ways users break them: for the
one-line tests of tests/reliability/test_tracebacks.py."""

from __future__ import annotations

from simulators.reach import ReachSim


class WrongSizeImages(ReachSim):
    """Its images are 2 rows shorter than its ``image_shape`` says."""

    def _observe(self):
        obs = super()._observe()
        obs.image = obs.image[:, :-2]
        return obs


class RaisesInStep(ReachSim):
    """Raises on its third step_chunk call (after a reset and a warm start's worth of nothing)."""

    calls = 0

    def step_chunk(self, actions, trace: bool = False):
        RaisesInStep.calls += 1
        if RaisesInStep.calls >= 3:
            raise RuntimeError("the physics engine lost contact with the table")
        return super().step_chunk(actions, trace=trace) if trace else super().step_chunk(actions)
