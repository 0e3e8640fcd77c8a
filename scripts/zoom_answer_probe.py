"""Where a trained zoom-tool policy's calls land and what it answers, per true colour (a diagnosis).

    .venv/bin/python scripts/zoom_answer_probe.py RUN_FOLDER CHECKPOINT [--split validation]

Evaluates the checkpoint (``RUN_FOLDER/checkpoints/CHECKPOINT``, with its own config) on ``--split``
of zoom_vqa's colour question, as `benchmarks/vlm_tools.py --validation` does, and prints the
success rate (the run's own figure for that checkpoint), how many calls zoomed inside the asked
quarter, and the (true colour, answer) counts. It hooks `simulators.tool_env.ZoomEnv`'s ``reset``,
``zoom`` and ``step`` to read them. docs/notes/2026-12-02-zoom-demo-settings.md quotes its output.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import simulators.tool_env as te  # noqa: E402
from mmrl.experiment import build_trainer, load_experiment  # noqa: E402
from mmrl.registry import SIMULATORS, adapter  # noqa: E402
from mmrl.trainer.evaluation import load_checkpoint_policy  # noqa: E402

calls: list[tuple[str, int, int, int]] = []  # (question, x, y, the small image's side)
answers: list[tuple[str, str]] = []
read: list[bool] = []  # per answer after a call: does it name the colour of the quarter the call looked at?
read_asked: list[tuple[int, bool]] = []  # per answer after a call inside the asked quarter: (its object's side, right?)
_reset, _zoom, _step = te.ZoomEnv.reset, te.ZoomEnv.zoom, te.ZoomEnv.step
QUARTERS = adapter("datasets.zoom_vqa.builder").QUARTERS


def quarter(x: int, y: int, show: int) -> str:
    """The quarter of the small image (side ``show``) holding point (x, y), named as questions name it."""
    return f"{'top' if y < show // 2 else 'bottom'} {'left' if x < show // 2 else 'right'}"


def reset(self, record):
    self.probe_question, self.probe_solution = record["prompt"], record.get("solution")
    meta = record.get("meta") or {}
    # the quarters' colours, in the dataset's row-major order of QUARTERS (zoom_vqa's colour question)
    self.probe_colors = dict(zip(QUARTERS, meta["colors"])) if "colors" in meta else None
    self.probe_looked = None
    box = meta.get("box")
    self.probe_asked = (meta.get("quarter"), box[2] - box[0]) if box else None
    return _reset(self, record)


def zoom(self, x: int, y: int):
    """See the image around a point at full resolution.

    Args:
        x: column in the small image (0: left)
        y: row in the small image (0: top)
    """
    calls.append((self.probe_question, int(x), int(y), self.show_size))
    self.probe_looked = quarter(int(x), int(y), self.show_size)
    return _zoom(self, x, y)


def step(self, messages):
    out = _step(self, messages)
    last = messages[-1]["content"]
    if not isinstance(last, str):
        last = " ".join(c.get("text", "") for c in last if isinstance(c, dict))
    if "tool_call" not in last:
        answers.append((self.probe_solution, last.strip()[:20]))
        if self.probe_colors and self.probe_looked is not None:
            right = self.probe_colors[self.probe_looked] in last.lower()
            read.append(right)
            if self.probe_asked and self.probe_looked == self.probe_asked[0]:
                read_asked.append((self.probe_asked[1], right))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", type=Path)
    p.add_argument("checkpoint", help="e.g. iter_000300")
    p.add_argument("--split", default="validation")
    p.add_argument("--episodes", type=int, default=96)
    a = p.parse_args()
    te.ZoomEnv.reset, te.ZoomEnv.zoom, te.ZoomEnv.step = reset, zoom, step
    ck = a.run / "checkpoints" / a.checkpoint
    overrides = [f"trainer.eval_episodes={a.episodes}", "trainer.resume=false", "warm_start.dataset=null"]
    cfg = load_experiment(ck / "config.yaml", [*overrides, "run.output_dir=/tmp/zoom_answer_probe"])
    trainer = build_trainer(cfg)
    load_checkpoint_policy(ck, trainer.policy, cfg)
    kwargs = {**cfg.sim.kwargs, "split": a.split}
    trainer.eval_sim = SIMULATORS.build(cfg.sim.type, num_envs=cfg.sim.eval_num_envs, seed=2, device="cpu", **kwargs)
    res = trainer.evaluate("probe")
    inside = 0
    for q, x, y, show in calls:
        inside += quarter(x, y, show) in q
    print(f"success {res['success_rate']:.4f}; calls {len(calls)}, inside the asked quarter {inside}")
    print("calls at (x, y):", dict(collections.Counter((x, y) for _, x, y, _ in calls).most_common(8)))
    if read:
        print(f"answers naming the colour of the quarter the call looked at: {sum(read)} of {len(read)}")
    if read_asked:  # reading by the object's size, calls inside the asked quarter only
        parts = []
        for lo, hi in ((1, 10), (11, 14), (15, 18), (19, 22), (23, 64)):
            hits = [ok for side, ok in read_asked if lo <= side <= hi]
            if hits:
                parts.append(f"{lo}-{hi} px {sum(hits)}/{len(hits)}")
        print("right answers after a call inside the asked quarter, by its object's side:", ", ".join(parts))
    for (truth, said), n in sorted(collections.Counter(answers).items(), key=lambda kv: -kv[1]):
        print(f"{truth:>8} -> {said:<10} {n}")


if __name__ == "__main__":
    main()
