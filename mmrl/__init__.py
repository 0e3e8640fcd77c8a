"""mmrl: reinforcement-learning post-training for multimodal policies (VLM, VLA, diffusion)."""

__version__ = "0.1.0"
