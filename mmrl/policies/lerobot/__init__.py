"""Pretrained LeRobot VLAs (SmolVLA, PI0, PI05) as an mmrl policy family (``policy.type: lerobot``).

- `policy`: the config and the `LeRobotVLAPolicy` (load, sample with mmrl's flow samplers, exact
  log-probs of the executed actions, value head, fine-tuning modes, reference for the KL).
- `families`: per model family, the two calls into LeRobot's model: the prefix (images, language,
  state -> VLM output and KV cache) and the velocity of one denoising step.

Needs LeRobot 0.6.1 (Python >= 3.12): ``bash scripts/setup_lerobot.sh``.
"""
