"""mmrl: reinforcement-learning post-training for multimodal policies (VLM, VLA, diffusion)."""

__version__ = "0.1.0"

from mmrl.utils.threads import prefer_passive_waits as _prefer_passive_waits

_prefer_passive_waits()  # before torch is imported: sleeping OpenMP waits (mmrl.utils.threads)
