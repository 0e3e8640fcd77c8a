"""Policy families. Each registers under a name; the trainer builds them from the config's ``policy.type``."""

from mmrl.registry import POLICIES

POLICIES.register(
    "flow_vla",
    "mmrl.policies.flow_vla:FlowVLAPolicy",
    description="flow-matching VLA (pi0-style action expert) with Flow-SDE / CPS / Flow-Noise rollouts",
)

POLICIES.register(
    "gaussian",
    "mmrl.policies.gaussian:GaussianPolicy",
    description="diagonal-Gaussian MLP actor + critic on the state vector (SB3's MlpPolicy), for state tasks",
)

POLICIES.register(
    "dsrl",
    "mmrl.policies.dsrl:DSRLPolicy",
    description="DSRL: a SAC actor choosing the initial noise of a frozen flow policy (policy.base), whose "
    "deterministic ODE turns it into the action chunk (algorithm.objective: sac)",
)

POLICIES.register(
    "residual",
    "mmrl.policies.residual:ResidualPolicy",
    description="residual RL: a SAC actor adding a bounded correction to the chunk of a frozen flow policy "
    "(policy.base); its actions map back from demonstrations, so RLPD can mix them in (algorithm.objective: sac)",
)

POLICIES.register(
    "diffusion",
    "mmrl.policies.diffusion:DiffusionPolicy",
    description="flow-matching image and video generator (built-in tiny pixel or video model, diffusers SD3 / FLUX / "
    "Wan 2.1-2.2 with LoRA): Flow-GRPO, AWM and DiffusionNFT",
)

POLICIES.register(
    "token_vla",
    "mmrl.policies.token_vla:TokenVLAPolicy",
    description="action-token VLA (OpenVLA / OpenVLA-OFT style): a transformers image-text LM emitting "
    "action-bin tokens, autoregressive or parallel decoding",
    extra="vlm",
)

POLICIES.register(
    "vlm",
    "mmrl.policies.vlm:VLMPolicy",
    description="vision-language model answering questions (transformers image-text LM; HF generate or vLLM "
    "rollouts; full or LoRA fine-tuning): GRPO / DAPO / GSPO / RLOO on verifiable rewards",
    extra="vlm",
)

POLICIES.register(
    "lerobot",
    "mmrl.policies.lerobot.policy:LeRobotVLAPolicy",
    description="a pretrained LeRobot flow VLA (SmolVLA, PI0, PI05 checkpoints by hub id or folder) sampled by "
    "mmrl's Flow-SDE / CPS / Flow-Noise with exact log-probs of the executed actions",
    fix="bash scripts/setup_lerobot.sh (LeRobot 0.6.1 needs Python >= 3.12; run mmrl from .venv-lerobot)",
)

POLICIES.register(
    "world_model",
    "mmrl.policies.world_model:WorldModelPolicy",
    description="action-conditioned video world model (flow matching on the next frame given past frames, the "
    "instruction and the executed chunk; a state head): trained by its warm start, played as simulator world_model",
)

POLICIES.register(
    "wan_world_model",
    "mmrl.policies.wan_world_model:WanWorldModelPolicy",
    description="the world model's conditioning on Wan (diffusers WanTransformer3DModel and its VAE): context "
    "frames' latents at timestep 0 before the noised next frame's, action and state tokens after the instruction's",
    extra="diffusion",
)
