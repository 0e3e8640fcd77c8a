"""Rollout engines (HF generate, vLLM) behind `mmrl.engines.base.RolloutEngine`."""
