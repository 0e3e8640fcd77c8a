"""The off-policy hooks are a role a policy class opts into (`mmrl.policies.off_policy`), not part of
the base contract: a policy whose class is no `OffPolicyActor` is refused at config load, in one line,
when the objective is SAC, even where its capabilities claim reparameterised actions; and the roles
are where the policies that train off-policy (or are steered by those that do) have them."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import yaml

from mmrl.capabilities import Capabilities, missing_role, roles_of
from mmrl.config import ConfigError
from mmrl.experiment import load_experiment
from mmrl.policies.base import Policy, PolicyConfig
from mmrl.policies.dsrl import DSRLPolicy
from mmrl.policies.flow_vla import FlowVLAPolicy
from mmrl.policies.gaussian import GaussianPolicy
from mmrl.policies.off_policy import LatentNoiseBase, OffPolicyActor
from mmrl.policies.residual import ResidualPolicy
from mmrl.registry import POLICIES, Entry

NAME = "claims_reparameterized"


@dataclass
class ClaimsConfig(PolicyConfig):
    type: str = NAME


class ClaimsReparameterized(Policy[ClaimsConfig]):
    """Declares SAC's capability without taking the role that carries its hooks."""

    config_class = ClaimsConfig

    @classmethod
    def capabilities(cls, cfg: ClaimsConfig) -> Capabilities:
        return Capabilities(likelihood=False, reparameterized=True)


def sac_config(tmp_path, policy: dict):
    data = yaml.safe_load(open("configs/quickstart_dsrl.yaml"))
    data["policy"] = policy
    return load_experiment(data, [f"run.output_dir={tmp_path}"])


def test_a_policy_without_the_off_policy_role_is_refused_with_sac_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(POLICIES._entries, NAME, Entry(NAME, ClaimsReparameterized))
    with pytest.raises(ConfigError, match=r"'algorithm.objective' = 'sac' needs .* OffPolicyActor") as err:
        sac_config(tmp_path, {"type": NAME})
    assert "\n" not in str(err.value) and "ClaimsReparameterized" in str(err.value)
    with pytest.raises(ConfigError, match=r"OffPolicyActor .* policy 'flow_vla' \(FlowVLAPolicy\) is not") as err:
        sac_config(tmp_path, {"type": "flow_vla", "critic": False})
    assert "\n" not in str(err.value)


def test_the_policies_that_train_off_policy_have_the_roles():
    for cls in (GaussianPolicy, DSRLPolicy, ResidualPolicy):
        assert issubclass(cls, OffPolicyActor) and missing_role(cls, ["reparameterized"]) is None
    assert issubclass(FlowVLAPolicy, LatentNoiseBase) and roles_of(FlowVLAPolicy) == {"LatentNoiseBase"}
    assert missing_role(FlowVLAPolicy, ["reparameterized"]) == "reparameterized"
    assert missing_role(ClaimsReparameterized, ["latent_noise", "critic"]) == "latent_noise"
    # the base contract no longer carries them
    for hook in ("sample_reparameterized", "replay_state", "env_actions", "act_from_noise", "noise_shape"):
        assert not hasattr(Policy, hook), hook
