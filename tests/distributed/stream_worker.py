"""One rank of `test_stream_weights`: the tiny SmolVLM with LoRA, sharded by FSDP2 over the ranks
(its decoder layers and vision attention as units), streams its merged weights tensor by tensor
(`stream_weights`, every rank); rank 0 checks them against peft's merge of the unsharded model and
prints one JSON line."""

from __future__ import annotations

import copy
import json
import sys

import torch

from mmrl.utils.compat import patch_torchvision

patch_torchvision()

from mmrl.distributed import current, init  # noqa: E402
from mmrl.policies.vlm import VLMConfig, VLMPolicy, stream_weights  # noqa: E402
from mmrl.trainer.train_engine import TrainEngineConfig, build_train_engine  # noqa: E402


def main() -> None:
    init("cpu")
    torch.manual_seed(0)
    policy = VLMPolicy(VLMConfig(model="tiny", finetune="lora", max_new_tokens=4, max_prompt_tokens=64), action_dim=1)
    with torch.no_grad():  # a trained adapter (lora_B starts at zero)
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    expected = copy.deepcopy(policy.model).merge_and_unload().state_dict()
    engine = build_train_engine(TrainEngineConfig(backend="fsdp"), policy, 1e-3, "cpu")
    sharded = sum(type(p).__name__ == "DTensor" for p in policy.parameters())
    streamed = list(stream_weights(policy.model))
    if current().main:
        same = [k for k, v in streamed if k in expected and torch.equal(v, expected[k])]
        print(
            json.dumps(
                {
                    "ranks": current().world,
                    "units": len(engine.units),
                    "sharded_params": sharded,
                    "keys_match": [k for k, _ in streamed] == list(expected),
                    "equal": len(same),
                    "total": len(expected),
                    "max_diff": max(float((v - expected[k]).abs().max()) for k, v in streamed),
                }
            )
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
