"""Does the tiny Qwen2.5-VL learn the zoom demo's vision? SFT on one turn of zoom_vqa's demonstrations,
then greedy outputs on training and validation questions (the README of 2b86684, "The tool demo does not learn yet").

    .venv/bin/python scripts/zoom_sft_probe.py --turn 0 --steps 400    # the call: where to zoom
    .venv/bin/python scripts/zoom_sft_probe.py --turn 1 --steps 2000   # the answer, from the crop
    .venv/bin/python scripts/zoom_sft_probe.py --turn 0 --tools        # with the tools' system turn (slow)

The rows are `configs/vlm_zoom_tools.yaml`'s demonstrations (read from it: its question, grid and
overview), one turn only, for its policy; without ``--tools`` the conversation is rendered without
the tool schemas (prompts of ~100 tokens instead of ~790: 0.3 s a step instead of 2-4 s on one
thread). The README's table of the shape question was measured with the config of 2b86684. SFT: the
policy's own ``supervised_loss``, AdamW at a constant ``--lr``, batches of 16 from 256 training
questions, seed 0.
Printed: the loss every 50 steps, then per split the exact matches and, for calls, the right cells.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
CONFIG = ROOT / "configs/vlm_zoom_tools.yaml"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__)
    p.add_argument("--turn", type=int, choices=[0, 1], default=0, help="0: the call; 1: the answer after the crop")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--tools", action="store_true", help="keep the tools' system turn in the prompt")
    a = p.parse_args()
    from mmrl.data import load_dataset
    from mmrl.engines.base import SamplingConfig
    from mmrl.experiment import load_experiment
    from mmrl.policies.vlm import VLMPolicy

    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = load_experiment(CONFIG)  # the demo's policy, simulator and demonstration settings
    policy = VLMPolicy(cfg.policy, action_dim=1)

    def rows(split: str, n: int) -> dict:
        d = load_dataset(
            cfg.warm_start.dataset, num_samples=n, split=split, sim_kwargs=dict(cfg.sim.kwargs), **cfg.warm_start.kwargs
        )
        keep = [i for i, m in enumerate(d["meta"]) if m["turn"] == a.turn]
        out = {k: [d[k][i] for i in keep] for k in d}
        if not a.tools:
            out["tools"] = [None] * len(keep)
        return out

    train, val = rows("train", 256), rows("validation", 48)
    batch = policy.warm_start_batch(train)
    opt = torch.optim.AdamW(policy.parameters(), lr=a.lr, weight_decay=0.0)
    g, t0 = torch.Generator().manual_seed(0), time.time()
    policy.train()
    for step in range(a.steps):
        loss = policy.supervised_loss(batch.index(torch.randint(0, batch.size, (16,), generator=g))).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0 or step == a.steps - 1:
            print(f"step {step}: loss {loss.item():.4f} ({time.time() - t0:.0f} s)", flush=True)
    policy.eval()
    cell = lambda text: re.findall(r'"x": (\d+), "y": (\d+)', text)  # noqa: E731
    for name, d in (("train", {k: v[:48] for k, v in train.items()}), ("validation", val)):
        n = len(d["solution"])
        reqs = policy.requests(d["prompt"], d["images"], [[] for _ in range(n)], d["messages"], d["tools"])
        gens = policy.engine().generate(reqs, SamplingConfig(n=1, temperature=0.0, max_new_tokens=72))
        texts = [x.text.strip() for x in sorted(gens, key=lambda x: x.request_index)]
        exact = sum(t == s for t, s in zip(texts, d["solution"]))
        cells = sum(cell(t) == cell(s) for t, s in zip(texts, d["solution"])) if a.turn == 0 else None
        print(f"{name}: exact {exact} / {n}" + (f", right cell {cells} / {n}" if cells is not None else ""))
        print(f"  first outputs {texts[:4]}; targets {d['solution'][:4]}", flush=True)


if __name__ == "__main__":
    main()
