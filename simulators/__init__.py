"""Simulator adapters (import package `simulators`).

Every simulator implements the contract in `mmrl.simulator` and passes
`mmrl.checks.simulator.check_simulator`. Built-ins register lazily in `mmrl.registry.SIMULATORS`, so
importing this package never imports a heavy simulator dependency.
"""

from mmrl.checks.simulator import check_simulator
from mmrl.registry import SIMULATORS
from mmrl.simulator import Observation, Simulator, StepResult

SIMULATORS.register(
    "reach",
    f"{__name__}.reach:ReachSim",
    description="embedded pure-torch batched reach-the-named-target task (RGB + instruction)",
)

SIMULATORS.register(
    "world_model",
    f"{__name__}.world_model:WorldModelSim",
    description="a trained world model (policy.type: world_model or wan_world_model) played as a simulator from real "
    "start frames; success and the episode's end judged by an image reward model (default: success_detector)",
)

SIMULATORS.register(
    "gym",
    f"{__name__}.gym_env:GymSim",
    description="any registered gymnasium env id through gymnasium vector envs (images from render())",
    extra="gym",
)

SIMULATORS.register(
    "libero",
    f"{__name__}.libero:LiberoSim",
    description="LIBERO manipulation suites (robosuite/MuJoCo; spatial, object, goal, 10, 90); "
    "scene assets via MMRL_LIBERO_ASSETS",
    extra="libero",
)

SIMULATORS.register(
    "metaworld",
    f"{__name__}.metaworld:MetaWorldSim",
    description="Meta-World's 50 Sawyer manipulation tasks, one (metaworld:pick-place-v3) or MT10 / MT50, an "
    "instruction per task, train and held-out goal variations",
    extra="metaworld",
)

SIMULATORS.register(
    "maniskill",
    f"{__name__}.maniskill:ManiSkillSim",
    description="ManiSkill3 tasks (PickCube-v1, ...): GPU-batched on CUDA, one worker process per env on CPU",
    extra="sim",
)

SIMULATORS.register(
    "prompts",
    f"{__name__}.prompts:PromptSim",
    description="single-turn prompt -> image tasks scored by a reward model (diffusion alignment)",
)

SIMULATORS.register(
    "video_prompts",
    f"{__name__}.prompts:VideoPromptSim",
    description="single-turn prompt -> video tasks scored by a video reward model (video generator alignment)",
)

SIMULATORS.register(
    "qa",
    f"{__name__}.qa:QASim",
    description="visual question answering with a checkable answer scored by a text reward (VLM RL)",
)

SIMULATORS.register(
    "tool_env",
    f"{__name__}.tool_env:ToolEnvSim",
    description="multi-turn visual question answering with tools (text or image results) scored by a text reward",
)

__all__ = ["Observation", "StepResult", "Simulator", "check_simulator"]
