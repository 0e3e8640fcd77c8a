"""The VLM policy with ``engine: vllm`` (runs where vLLM is importable: ``.venv-vllm``): the trainer's
recomputed log-probs match the engine's, and after an update + `sync_rollout` the engine samples
from the updated weights (the mismatch stays at float noise instead of jumping)."""

import pytest
import torch

vllm = pytest.importorskip(
    "vllm",
    reason="vLLM not installed here: bash scripts/setup_vllm.sh, then run this "
    "file with .venv-vllm/bin/python -m pytest",
)

from mmrl.policies.vlm import VLMConfig, VLMPolicy  # noqa: E402
from simulators.qa import QASim  # noqa: E402

TOL = 1e-3


def test_vllm_policy_recomputes_engine_logprobs_and_syncs_updates():
    sim = QASim(num_envs=4, dataset="shapes_vqa", dataset_kwargs={"num_samples": 8, "tasks": ["count"]})
    torch.manual_seed(0)
    pol = VLMPolicy(
        VLMConfig(model="tiny", engine="vllm", max_new_tokens=6, max_prompt_tokens=64), action_dim=sim.action_dim
    )
    assert pol.recompute
    batch = pol.rollout(sim.reset([0, 0, 1, 1]), torch.Generator().manual_seed(0)).batch
    m = batch["completion_mask"]
    assert not any(t in pol.banned_ids for t in batch["completion"][m].tolist())
    assert pol.rollout_stats()["logp_mismatch_max"] < TOL
    opt = torch.optim.SGD([p for p in pol.parameters() if p.requires_grad], lr=0.5)
    (-pol.evaluate(batch).logp[m].sum()).backward()
    opt.step()
    pol.rollout(sim.reset([2, 2, 3, 3]), torch.Generator().manual_seed(1))
    assert pol.rollout_stats()["logp_mismatch_max"] > 10 * TOL  # the engine still has the old weights
    pol.sync_rollout()  # pushes the updated weights into the engine
    pol.rollout(sim.reset([2, 2, 3, 3]), torch.Generator().manual_seed(1))
    assert pol.rollout_stats()["logp_mismatch_max"] < TOL
