"""Plots of the generator and VLM benchmarks (image / video alignment demos, VLM demos, vs TRL, ranks).

Every function reads only ``benchmarks/results/`` (through `common.load`) and returns a figure;
`build.py` draws them into ``docs/assets/plots/``. The pages that embed them: docs/benchmarks/
diffusion-align.md, video-align.md, vlm-grpo.md, vlm-video.md, vlm-tools.md, vs-trl.md,
distributed.md, and the notes on the image and video demos.
"""

from __future__ import annotations

import statistics

from common import COLORS, figure, load, source

IMAGE_HELDOUT = "diffusion_align_3seeds_aff6184.json"
IMAGE_COST = "diffusion_cost_table_fc06636.json"
VIDEO_HELDOUT = "video_align_heldout_window_a49f0ab.json"
VIDEO_COST = "video_cost_a49f0ab.json"
VIDEO_VALIDATION = "video_align_validation_2026-12-03.json"
VIDEO_SWEEP = "video_flow_grpo_validation_sweep_1d26778.json"
NFT_VALIDATION = "nft_old_policy_validation_2026-11-28.json"
IMAGE_BEFORE_FIX = "diffusion_align_3seeds_ff2fcf8.json"
VLM_GRPO = "vlm_grpo_3seeds_6bfd848.json"
HACKING = "reward_hacking_3seeds_2026-12-07.json"
VLM_VIDEO = "vlm_video_3seeds_63d5d53.json"
VLM_TOOLS = "vlm_tools_heldout_688aff1.json"
VS_TRL = "vs_trl_a9ddf78.json"
DISTRIBUTED = "distributed_691df8b.json"

METHODS = {"flow_grpo": "Flow-GRPO", "awm": "AWM", "nft": "DiffusionNFT"}
METHOD_COLORS = {"flow_grpo": COLORS["other"], "awm": COLORS["third"], "nft": COLORS["mmrl"]}
SEED_STYLES = ["-", "--", ":"]


def _source(fig, *names: str, bottom: float = 0.2) -> None:
    """`common.source`, with room left under the x labels so the two do not overlap."""
    fig.subplots_adjust(bottom=bottom)
    source(fig, *names)


def _heldout_points(ax, data: dict, unit: str, window_label: str = "") -> None:
    """Each seed's held-out reward per arm (dots), the mean (a bar), ceiling and prompt-ignoring lines."""
    arms = [("pretrained", "pretrained_reward", COLORS["baseline"])]
    arms += [
        (METHODS[m] + (window_label if m == "flow_grpo" else ""), f"{m}_reward", METHOD_COLORS[m]) for m in METHODS
    ]
    for i, (_label, key, color) in enumerate(arms):
        values = data[key]
        ax.bar(i, statistics.fmean(values), width=0.6, color=color, alpha=0.35)
        ax.scatter([i + d for d in (-0.12, 0.0, 0.12)], values, color=color, zorder=3, s=22)
    ax.axhline(data["gold_reward"], color=COLORS["ceiling"], lw=1.2, ls="--")
    ax.text(
        len(arms) - 0.5,
        data["gold_reward"] - 0.04,
        f"ceiling: correct {unit} of each prompt",
        ha="right",
        va="top",
        fontsize=7,
        color=COLORS["ceiling"],
    )
    ax.axhline(data["prompt_ignoring_reward"], color=COLORS["baseline"], lw=1.0, ls=":")
    ax.text(
        len(arms) - 0.5,
        data["prompt_ignoring_reward"] + 0.015,
        f"correct {unit} of another prompt",
        ha="right",
        va="bottom",
        fontsize=7,
        color=COLORS["baseline"],
    )
    ax.set_xticks(range(len(arms)), [a[0] for a in arms], fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("held-out reward (bar: mean, dots: seeds 0-2)")


def image_heldout():
    data = load(IMAGE_HELDOUT)
    fig, (ax,) = figure(6.4, 3.8)
    _heldout_points(ax, data, "images")
    ax.set_title(f"Image demo, held-out reward after {data['iterations']} iterations (aff6184)", fontsize=10)
    _source(fig, IMAGE_HELDOUT)
    return fig


def _curves(ax, runs: list[dict], x: str) -> None:
    """Held-out reward against ``x`` per method (colour) and seed (line style)."""
    for s, run in enumerate(runs):
        for m, points in run.items():
            ax.plot(
                [p[x] for p in points],
                [p["reward"] for p in points],
                color=METHOD_COLORS[m],
                ls=SEED_STYLES[s % 3],
                lw=1.3,
                marker="o",
                ms=2.5,
                label=METHODS[m] if s == 0 else None,
            )


def image_curves():
    data = load(IMAGE_HELDOUT)
    fig, (a, b) = figure(9.6, 3.6, ncols=2)
    _curves(a, data["curves"], "iteration")
    _curves(b, data["curves"], "rl_seconds")
    a.set_xlabel("RL iteration (64 images each)")
    b.set_xlabel("RL seconds (one torch thread; three seeds side by side)")
    for ax in (a, b):
        ax.set_ylabel("held-out reward")
    a.legend(fontsize=8, title="seed 0 solid, 1 dashed, 2 dotted", title_fontsize=7)
    fig.suptitle("Image demo: held-out reward per seed on the way (aff6184)", fontsize=10)
    _source(fig, IMAGE_HELDOUT)
    return fig


def _cost_bars(ax, cost: dict, unit: str) -> None:
    steps = sorted(cost["flow_grpo"], key=int)
    width = 0.8 / len(METHODS)
    for j, m in enumerate(METHODS):
        xs = [i + (j - 1) * width for i in range(len(steps))]
        ax.bar(xs, [cost[m][k] for k in steps], width=width, color=METHOD_COLORS[m], label=METHODS[m])
    ax.set_xticks(range(len(steps)), [f"K = {k}" for k in steps])
    ax.set_ylabel(f"seconds of RL per training {unit}")
    ax.legend(fontsize=8)


def image_cost():
    data = load(IMAGE_COST)
    fig, (ax,) = figure(5.6, 3.4)
    _cost_bars(ax, data["cost_s_per_sample"], "image")
    ax.set_title("Image demo: cost per sample at K denoising steps (fc06636)", fontsize=10)
    _source(fig, IMAGE_COST)
    return fig


def nft_old_policy():
    """DiffusionNFT's old policy: the variants on validation prompts, and held-out before / after the fix."""
    val = load(NFT_VALIDATION)
    before, after = load(IMAGE_BEFORE_FIX), load(IMAGE_HELDOUT)
    fig, (a, b) = figure(9.6, 3.6, ncols=2)
    variants = [
        ("null_per_step", "v_old detached per step", COLORS["baseline"]),
        ("it0", "old copy, decay 0", COLORS["mmrl"]),
        ("it05", "old copy, decay 0.5", COLORS["third"]),
    ]
    for key, label, color in variants:
        for s, run in enumerate(val[key]["curves"]):
            pts = run["nft"]
            a.plot(
                [p["iteration"] for p in pts],
                [p["reward"] for p in pts],
                color=color,
                ls=SEED_STYLES[s],
                marker="o",
                ms=2.5,
                label=label if s == 0 else None,
            )
    for s, run in enumerate(val["it0"]["curves"]):  # the same Flow-GRPO runs as null_per_step's
        pts = run["flow_grpo"]
        a.plot(
            [p["iteration"] for p in pts],
            [p["reward"] for p in pts],
            color=COLORS["other"],
            ls=SEED_STYLES[s],
            lw=1,
            label="Flow-GRPO" if s == 0 else None,
        )
    a.set_xlabel("RL iteration")
    a.set_ylabel("validation reward")
    a.set_title("validation prompts, seeds 100 (solid) / 101 (dashed)", fontsize=9)
    a.legend(fontsize=7)
    for data, label, color in (
        (before, "detached per step (ff2fcf8)", COLORS["baseline"]),
        (after, "old copy, decay 0 (aff6184)", COLORS["mmrl"]),
    ):
        for s, run in enumerate(data["curves"]):
            pts = run["nft"]
            b.plot(
                [p["iteration"] for p in pts],
                [p["reward"] for p in pts],
                color=color,
                ls=SEED_STYLES[s],
                marker="o",
                ms=2.5,
                label=label if s == 0 else None,
            )
    b.set_xlabel("RL iteration")
    b.set_ylabel("held-out reward")
    b.set_title("DiffusionNFT held-out, seeds 0 / 1 / 2 (solid / dashed / dotted)", fontsize=9)
    b.legend(fontsize=7)
    _source(fig, NFT_VALIDATION, IMAGE_BEFORE_FIX, IMAGE_HELDOUT)
    return fig


def video_heldout():
    data = load(VIDEO_HELDOUT)
    fig, (ax,) = figure(6.4, 3.8)
    _heldout_points(ax, data, "clips", window_label="\n(SDE on steps 0-2)")
    ax.set_title(f"Video demo, held-out reward after {data['iterations']} iterations (a49f0ab)", fontsize=10)
    _source(fig, VIDEO_HELDOUT)
    return fig


def video_curves():
    data = load(VIDEO_HELDOUT)
    fig, (ax,) = figure(6.4, 3.8)
    runs = [
        {m: [dict(p, clips=p["train_episodes"]) for p in points] for m, points in run.items()} for run in data["curves"]
    ]
    _curves(ax, runs, "clips")
    ax.set_xlabel("training clips (32 per iteration)")
    ax.set_ylabel("held-out reward")
    ax.legend(fontsize=8, title="seed 0 solid, 1 dashed, 2 dotted", title_fontsize=7)
    ax.set_title("Video demo: held-out reward per seed on the way (a49f0ab)", fontsize=10)
    _source(fig, VIDEO_HELDOUT)
    return fig


def video_cost():
    data = load(VIDEO_COST)
    fig, (ax,) = figure(5.6, 3.4)
    _cost_bars(ax, data["cost_s_per_sample"], "clip")
    ax.set_title("Video demo: cost per clip at K denoising steps (a49f0ab)", fontsize=10)
    _source(fig, VIDEO_COST)
    return fig


def video_validation_curves():
    data = load(VIDEO_VALIDATION)
    fig, (ax,) = figure(6.4, 3.6)
    for m, seeds in data["curves"].items():
        for s, (_seed, points) in enumerate(sorted(seeds.items())):
            ax.plot(
                [p["iteration"] for p in points],
                [p["reward"] for p in points],
                color=METHOD_COLORS[m],
                ls=SEED_STYLES[s],
                marker="o",
                ms=2.5,
                label=METHODS[m] if s == 0 else None,
            )
    ax.set_xlabel("RL iteration (32 clips each)")
    ax.set_ylabel("validation reward")
    ax.legend(fontsize=8, title="seed 100 solid, 101 dashed", title_fontsize=7)
    ax.set_title("Video demo on validation prompts (1c94ea4; Flow-GRPO every step stochastic)", fontsize=9)
    _source(fig, VIDEO_VALIDATION)
    return fig


def video_window_sweep():
    data = load(VIDEO_SWEEP)
    fig, (ax,) = figure(6.4, 3.6)
    arms = [("template", "every step stochastic", COLORS["baseline"]), ("window_0_3", "window [0, 3]", COLORS["mmrl"])]
    for key, label, color in arms:
        for s, points in enumerate(c["flow_grpo"] for c in data[key]["curves"]):
            ax.plot(
                [p["iteration"] for p in points],
                [p["reward"] for p in points],
                color=color,
                ls=SEED_STYLES[s],
                marker="o",
                ms=2.5,
                label=label if s == 0 else None,
            )
    ax.set_xlabel("RL iteration (32 clips each)")
    ax.set_ylabel("validation reward")
    ax.legend(fontsize=8, title="seed 100 solid, 101 dashed, 102 dotted", title_fontsize=7)
    ax.set_title("Video demo, Flow-GRPO on validation prompts: every step vs the window", fontsize=9)
    _source(fig, VIDEO_SWEEP)
    return fig


def _before_after(ax, rows: list[tuple[str, list[float], list[float]]], gold: float, constant: float) -> None:
    """Per arm: each seed's accuracy before RL (after SFT) and after, joined by a line."""
    for i, (_label, before, after) in enumerate(rows):
        color = COLORS["mmrl"] if i == 0 else COLORS["baseline"]
        for j, (b, a) in enumerate(zip(before, after)):
            x0, x1 = 2 * i + 0.1 * (j - 1), 2 * i + 1 + 0.1 * (j - 1)
            ax.plot([x0, x1], [b, a], color=color, marker="o", ms=4, lw=1)
    ticks = [x for i in range(len(rows)) for x in (2 * i, 2 * i + 1)]
    names = [n for label, _, _ in rows for n in (f"{label}\nafter SFT", f"{label}\nafter RL")]
    ax.set_xticks(ticks, names, fontsize=7)
    ax.axhline(gold, color=COLORS["ceiling"], ls="--", lw=1.2)
    ax.text(ticks[-1], gold - 0.03, "gold answers", ha="right", va="top", fontsize=7, color=COLORS["ceiling"])
    ax.axhline(constant, color=COLORS["baseline"], ls=":", lw=1)
    ax.text(
        ticks[-1],
        constant + 0.015,
        "best constant answer",
        ha="right",
        va="bottom",
        fontsize=7,
        color=COLORS["baseline"],
    )
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("held-out accuracy (one line per seed)")


def vlm_grpo_before_after():
    d = load(VLM_GRPO)
    fig, (ax,) = figure(4.6, 3.6)
    _before_after(ax, [("GRPO", d["sft_accuracy"], d["rl_accuracy"])], d["gold_accuracy"], d["constant_accuracy"])
    ax.set_title("VLM quickstart, 3 seeds (6bfd848)", fontsize=10)
    _source(fig, VLM_GRPO)
    return fig


def vlm_video_before_after():
    d = load(VLM_VIDEO)
    fig, (ax,) = figure(6.0, 3.6)
    rows = [
        ("video (4 frames)", d["sft_accuracy"], d["rl_accuracy"]),
        ("one frame", d["single_frame_sft_accuracy"], d["single_frame_rl_accuracy"]),
    ]
    _before_after(ax, rows, d["gold"], d["constant_accuracy"])
    ax.set_title("VLM video-QA demo, 3 seeds (63d5d53)", fontsize=10)
    _source(fig, VLM_VIDEO)
    return fig


def vlm_tools_before_after():
    d = load(VLM_TOOLS)
    fig, (ax,) = figure(6.0, 3.6)
    rows = [
        ("zoom tool", d["sft_accuracy"], d["rl_accuracy"]),
        ("no tool", d["no_tool_sft_accuracy"], d["no_tool_rl_accuracy"]),
    ]
    _before_after(ax, rows, d["gold"], d["constant_accuracy"])
    ax.set_title("Zoom-tool demo, 3 seeds (688aff1)", fontsize=10)
    _source(fig, VLM_TOOLS)
    return fig


def vs_trl_steps():
    d = load(VS_TRL)
    fig, (ax,) = figure(5.6, 3.4)
    repeats = range(1, len(d["mmrl_step_s_repeats"]) + 1)
    width = 0.38
    ax.bar([r - width / 2 for r in repeats], d["mmrl_step_s_repeats"], width=width, color=COLORS["mmrl"], label="mmrl")
    ax.bar(
        [r + width / 2 for r in repeats],
        d["trl_step_s_repeats"],
        width=width,
        color=COLORS["baseline"],
        label="TRL GRPOTrainer",
    )
    ax.axhline(d["mmrl_step_s"], color=COLORS["mmrl"], ls="--", lw=1)
    ax.axhline(d["trl_step_s"], color=COLORS["baseline"], ls="--", lw=1)
    ax.set_xticks(list(repeats), [f"repeat {r}" for r in repeats], fontsize=8)
    ax.set_ylabel("seconds per GRPO step (dashed: medians)")
    ax.legend(fontsize=8)
    ax.set_title("Identical GRPO work, tiny SmolVLM on one CPU thread (a9ddf78)", fontsize=9)
    _source(fig, VS_TRL)
    return fig


def distributed_ranks():
    d = load(DISTRIBUTED)
    fig, (a, b) = figure(9.2, 3.4, ncols=2)
    ranks = sorted(d["samples_per_s"], key=int)
    a.bar(
        ranks, [d["samples_per_s"][r] for r in ranks], color=[COLORS["baseline"]] + [COLORS["mmrl"]] * (len(ranks) - 1)
    )
    a.set_xlabel("ranks (gloo, on 2 CPU cores)")
    a.set_ylabel("samples (env steps) per second")
    a.set_title(f"one global batch of {d['global_envs']} envs", fontsize=9)
    mem = d["param_optim_bytes_per_rank"]
    b.bar(["DDP", "FSDP2"], [mem["ddp"] / 1e6, mem["fsdp"] / 1e6], color=[COLORS["baseline"], COLORS["mmrl"]])
    b.set_ylabel("MB per rank (parameters + Adam)")
    b.set_title("flow VLA, 2 ranks", fontsize=9)
    fig.suptitle("benchmarks/distributed.py on a 2-core CPU (691df8b)", fontsize=10, y=1.02)
    fig.subplots_adjust(wspace=0.35)
    _source(fig, DISTRIBUTED)
    return fig


def reward_hacking():
    """Per seed, the held-out reward and the images' diversity against RL iterations, without and
    with the guards, while the trained (hackable) reward climbs."""
    data = load(HACKING)
    arms = {"unguarded": COLORS["other"], "guarded": COLORS["mmrl"]}
    fig, axes = figure(10.0, 3.4, ncols=3)
    styles = ["-", "--", ":"]
    panels = (("trained", "trained reward (JPEG compressibility)"), ("heldout", "held-out reward (shapes)"))
    for ax, (key, title) in zip(axes, (*panels, ("diversity", "diversity (RMS pixel distance)"))):
        for arm, color in arms.items():
            for k, seed in enumerate(data["seeds"]):
                points = data["curves"][str(seed)][arm]
                label = f"{arm}, seed {seed}" if key == "heldout" else None
                ax.plot(
                    [p["iteration"] for p in points], [p[key] for p in points], color=color, ls=styles[k], label=label
                )
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("RL iteration", fontsize=8)
    axes[1].legend(fontsize=6)
    fig.subplots_adjust(bottom=0.2, wspace=0.3)
    source(fig, HACKING)
    return fig


PLOTS = {
    "gen_image_heldout.png": image_heldout,
    "gen_image_curves.png": image_curves,
    "gen_image_cost.png": image_cost,
    "gen_nft_old_policy.png": nft_old_policy,
    "gen_video_heldout.png": video_heldout,
    "gen_video_curves.png": video_curves,
    "gen_video_cost.png": video_cost,
    "gen_video_validation_curves.png": video_validation_curves,
    "gen_video_window_sweep.png": video_window_sweep,
    "gen_vlm_grpo.png": vlm_grpo_before_after,
    "gen_vlm_video.png": vlm_video_before_after,
    "gen_vlm_tools.png": vlm_tools_before_after,
    "gen_vs_trl.png": vs_trl_steps,
    "gen_distributed.png": distributed_ranks,
    "gen_reward_hacking.png": reward_hacking,
}
