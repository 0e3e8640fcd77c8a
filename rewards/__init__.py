"""Reward models, registered by name (``mmrl list``).

A reward model scores a batch of rollouts: ``__call__(batch) -> float tensor [N]``. Simulators
already return their task reward (success); reward models registered here replace or add to it
in the trainer's reward stage. Third-party packages register more under the ``mmrl.rewards``
entry-point group.
"""
