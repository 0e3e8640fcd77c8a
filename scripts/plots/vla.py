"""Plots of the VLA, gymnasium-control and off-policy benchmarks.

Every function reads only ``benchmarks/results/`` (through `common.load`) and returns a figure;
`build.py` draws them into ``docs/assets/plots/``. The pages that embed them: docs/benchmarks/
quickstart.md, vs-sb3.md, sample-efficiency.md, semantic-reward.md, the guides vla-simulation.md,
gym-control.md and off-policy.md, and the notes on the quickstart and on Ant.
"""

from __future__ import annotations

import statistics

from common import COLORS, RESULTS, figure, load, source

QUICKSTART = "quickstart_gamma09_31seeds_2026-12-07.json"
VS_SB3 = "vs_sb3_target_kl_test_aaeda78.json"
ANT_OLD = "vs_sb3_ant1m_test_51b5af7.json"
ANT_F2C = "vs_sb3_ant1m_flow_test_f2c2b34.json"
ANT_AUTO = "vs_sb3_ant1m_std_auto_test_e7cc63d.json"
DSRL_UTD1 = "sample_efficiency_reach_2ae4419.json"
DSRL_UTD4 = "sample_efficiency_reach_dsrl_utd4_6398891.json"
RLPD = "sample_efficiency_reach_rlpd_dfde334.json"
SAC = "sample_efficiency_sac_d17e7b8.json"
SEMANTIC = "semantic_reward_6bfd848.json"
SHAPING = "semantic_shaping_2026-12-07.json"
ANT_NOISE = "ant_noise_sweep_h200_2026-11-27.json"
ANT_STD = "action_std_sweep_h200_2026-11-28.json"
H200_QUICKSTART = "quickstart_benchmark_h200_2026-11-27.log"
OFFSETS = (-0.12, 0.0, 0.12)


def _source(fig, *names: str, bottom: float = 0.2) -> None:
    """`common.source`, with room left under the x labels so the two do not overlap."""
    fig.subplots_adjust(bottom=bottom)
    source(fig, *names)


def _ratio(value: float, sb3_mean: float, random: float) -> float:
    """vs_sb3.py's ratio_return: (value - random) / (SB3 - random); 1 = SB3's level, 0 = random's."""
    return (value - random) / (sb3_mean - random)


def vs_sb3_ratios():
    """Return ratio to SB3 per task (bar: the mean's ratio as vs_sb3.py prints it, dots: each seed's
    return over SB3's mean), and the env-steps-per-second ratio, at aaeda78."""
    data = load(VS_SB3)
    tasks = []
    for part in ("ant_flow", "mujoco_200k", "pendulums"):
        for task, row in data[part].items():
            if isinstance(row, dict) and "flow" in row:
                tasks.append((task, row))
    order = ["Ant-v5", "HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Swimmer-v5", "Pendulum-v1", "InvertedPendulum-v5"]
    tasks.sort(key=lambda t: order.index(t[0]))
    fig, (ax, ax2) = figure(9.6, 3.8, ncols=2)
    names, speed = [], []
    for i, (task, row) in enumerate(tasks):
        if task == "Ant-v5":  # SB3's side ran separately (vs_sb3_target_kl_test_aaeda78.json: ant_sb3_now)
            sb3 = data["ant_sb3_now"]["return_per_seed"]
            mean_ratio, speed_ratio = data["ant_ratio_return"], data["ant_ratio_steps_per_s"]
        else:
            sb3 = row["sb3"]["return"]["per_seed"]
            mean_ratio, speed_ratio = row["ratio_return"], row["ratio_steps_per_s"]
        sb3_mean, random = statistics.fmean(sb3), row["random_return"]
        seeds = [_ratio(v, sb3_mean, random) for v in row["flow"]["return"]["per_seed"]]
        ax.bar(i, mean_ratio, width=0.6, color=COLORS["mmrl"], alpha=0.35)
        ax.scatter([i + d for d in OFFSETS], seeds, color=COLORS["mmrl"], s=18, zorder=3)
        names.append(f"{task} ({row['env_steps'] // 1000}k)")
        speed.append(speed_ratio)
    ax.set_yscale("log")
    ax.set_yticks([0.5, 1, 2, 4, 8], ["0.5", "1", "2", "4", "8"])
    ax.minorticks_off()
    ax.axhline(1.0, color=COLORS["baseline"], lw=1.2, ls="--")
    ax.axhline(0.9, color=COLORS["other"], lw=1.0, ls=":")
    ax.text(len(names) - 0.5, 1.03, "SB3 PPO", ha="right", va="bottom", fontsize=7, color=COLORS["baseline"])
    ax.text(len(names) - 0.5, 0.88, "0.9 of SB3", ha="right", va="top", fontsize=7, color=COLORS["other"])
    ax.set_xticks(range(len(names)), names, fontsize=7, rotation=35, ha="right")
    ax.set_ylabel("return ratio to SB3 (log; bar: mean, dots: seeds 0-2)", fontsize=8)
    ax.set_title("mmrl flow policy (state template) vs SB3 PPO", fontsize=9)
    ax2.bar(range(len(names)), speed, width=0.6, color=COLORS["mmrl"], alpha=0.6)
    ax2.axhline(1.0, color=COLORS["baseline"], lw=1.2, ls="--")
    ax2.set_xticks(range(len(names)), names, fontsize=7, rotation=35, ha="right")
    ax2.set_ylabel("training env steps/s, mmrl / SB3", fontsize=8)
    ax2.set_title("speed ratio (same machine, same load)", fontsize=9)
    _source(fig, VS_SB3, bottom=0.3)
    return fig


def ant_ratio_history():
    """Ant-v5 at 1M env steps, reported seeds 0-2: each template's per-seed return against SB3's."""
    old, f2c, auto, now = load(ANT_OLD), load(ANT_F2C), load(ANT_AUTO), load(VS_SB3)
    sb3 = old["Ant-v5"]["sb3"]["return"]["per_seed"]
    steps = [
        ("fixed Flow-SDE noise\n(51b5af7)", old["Ant-v5"]["flow"]["return"]["per_seed"]),
        ("learned Gaussian on\nthe ODE (f2c2b34)", f2c["Ant-v5"]["flow"]["return"]["per_seed"]),
        ("+ auto initial std\n(e7cc63d)", auto["Ant-v5"]["flow"]["return"]["per_seed"]),
        ("+ KL cap 0.2\n(aaeda78)", now["ant_flow"]["Ant-v5"]["flow"]["return"]["per_seed"]),
    ]
    fig, (ax,) = figure(10.5, 3.8)
    ax.bar(-1, statistics.fmean(sb3), width=0.6, color=COLORS["baseline"], alpha=0.35)
    ax.scatter([-1 + d for d in OFFSETS], sb3, color=COLORS["baseline"], s=18, zorder=3)
    for i, (_label, values) in enumerate(steps):
        ax.bar(i, statistics.fmean(values), width=0.6, color=COLORS["mmrl"], alpha=0.35)
        ax.scatter([i + d for d in OFFSETS], values, color=COLORS["mmrl"], s=18, zorder=3)
    ax.axhline(old["Ant-v5"]["random_return"], color=COLORS["baseline"], lw=1.0, ls=":")
    ax.set_xticks(range(-1, len(steps)), ["SB3 PPO\n(defaults)"] + [s[0] for s in steps], fontsize=7)
    ax.set_ylabel("held-out return (bar: mean, dots: seeds 0-2)", fontsize=8)
    ax.set_title("Ant-v5, 1M env steps: the flow template over its fixes", fontsize=9)
    _source(fig, ANT_OLD, ANT_F2C, ANT_AUTO, VS_SB3, bottom=0.24)
    return fig


def quickstart_per_seed():
    """Held-out success of each seed after the warm start and after 60 RL iterations: the eleven seeds
    the earlier settings were chosen on, then the twenty fresh ones."""
    data = load(QUICKSTART)
    groups = [("seeds 0-5, 10-14", data["original_11"]), ("fresh seeds 20-39", data["fresh_20"])]
    seeds = [s for _, g in groups for s in g["seeds"]]
    sft = [v for _, g in groups for v in g["sft_success"]]
    rl = [v for _, g in groups for v in g["rl_success"]]
    fig, (ax,) = figure(9.6, 3.6)
    xs = list(range(len(seeds)))
    ax.scatter(xs, sft, color=COLORS["baseline"], s=22, label="warm start", zorder=3)
    ax.scatter(xs, rl, color=COLORS["mmrl"], s=22, label="after 60 RL iterations", zorder=3)
    for x, lo, hi in zip(xs, sft, rl):
        ax.plot([x, x], [lo, hi], color=COLORS["mmrl"], alpha=0.3, lw=1.5)
    split = len(groups[0][1]["seeds"]) - 0.5
    ax.axvline(split, color=COLORS["baseline"], lw=0.8)
    for (label, _), x in zip(groups, (split / 2, split + (len(seeds) - split) / 2)):
        ax.text(x, 0.03, label, ha="center", fontsize=7, color=COLORS["baseline"])
    for value, label, color in [
        (data["expert"], "scripted expert (ceiling)", COLORS["ceiling"]),
        (data["demonstrator"], "the demonstrator imitated", COLORS["other"]),
        (data["random"], "random actions", COLORS["baseline"]),
    ]:
        ax.axhline(value, color=color, lw=1.0, ls="--")
        ax.text(len(xs) - 0.6, value + 0.012, label, ha="right", va="bottom", fontsize=7, color=color)
    ax.set_xticks(xs, [str(s) for s in seeds], fontsize=6)
    ax.set_xlabel("seed")
    ax.set_ylabel("held-out success (256 episodes)")
    ax.set_ylim(0, 1.08)
    ax.legend(fontsize=7, loc="lower right", bbox_to_anchor=(1.0, 0.12))
    ax.set_title("Quickstart (gamma 0.9), 31 seeds", fontsize=9)
    _source(fig, QUICKSTART, bottom=0.2)
    return fig


def sample_efficiency_reach():
    """Env steps to 0.85 held-out success on reach and the final success, PPO against DSRL and RLPD."""
    utd1, utd4, rlpd = load(DSRL_UTD1)["reach"], load(DSRL_UTD4)["reach"], load(RLPD)["reach"]
    arms = [
        ("PPO\n(quickstart)", utd1["ppo"], COLORS["baseline"]),
        ("DSRL\nUTD 1", utd1["dsrl"], COLORS["third"]),
        ("DSRL\nUTD 4", utd4["dsrl"], COLORS["other"]),
        ("RLPD\n(residual + demos)", rlpd["rlpd"], COLORS["mmrl"]),
    ]
    fig, (ax, ax2) = figure(9.6, 3.8, ncols=2)
    for i, (_label, arm, color) in enumerate(arms):
        steps = [s / 1000 for s in arm["steps_to_level"]]
        ax.bar(i, statistics.fmean(steps), width=0.6, color=color, alpha=0.35)
        ax.scatter([i + d for d in OFFSETS], steps, color=color, s=18, zorder=3)
        ax2.bar(i, arm["final_mean"], width=0.6, color=color, alpha=0.35)
        ax2.scatter([i + d for d in OFFSETS], arm["final"], color=color, s=18, zorder=3)
        ax2.scatter([i + d for d in OFFSETS], arm["start"], color=color, s=14, marker="x", zorder=3)
    labels = [a[0] for a in arms]
    ax.set_xticks(range(len(arms)), labels, fontsize=7)
    ax.set_ylabel(f"thousand env steps to {utd1['level']} held-out success", fontsize=8)
    ax.set_title("Env steps to the level (bar: mean, dots: seeds 0-2)", fontsize=9)
    ax2.set_xticks(range(len(arms)), labels, fontsize=7)
    ax2.set_ylabel("held-out success (x: start, dot: end)", fontsize=8)
    ax2.set_ylim(0, 1.05)
    ax2.axhline(utd1["level"], color=COLORS["baseline"], lw=1.0, ls=":")
    ax2.set_title("Start and end of each run", fontsize=9)
    _source(fig, DSRL_UTD1, DSRL_UTD4, RLPD, bottom=0.2)
    return fig


def sac_vs_sb3():
    """mmrl's SAC against SB3's SAC at 20k env steps, per seed."""
    data = load(SAC)
    tasks = [t for t, row in data.items() if isinstance(row, dict) and "sac" in row]
    fig, axes = figure(7.2, 3.2, ncols=len(tasks))
    for ax, task in zip(axes, tasks):
        row = data[task]
        for i, (_label, key, color) in enumerate(
            [("SB3 SAC", "sb3", COLORS["baseline"]), ("mmrl SAC", "sac", COLORS["mmrl"])]
        ):
            values = row[key]["return"]["per_seed"]
            ax.bar(i, row[key]["return"]["mean"], width=0.6, color=color, alpha=0.35)
            ax.scatter([i + d for d in OFFSETS], values, color=color, s=18, zorder=3)
        ax.axhline(row["random_return"], color=COLORS["baseline"], lw=1.0, ls=":")
        ax.set_xticks([0, 1], ["SB3 SAC", "mmrl SAC"], fontsize=8)
        ax.set_title(f"{task}, {row['env_steps'] // 1000}k env steps", fontsize=9)
    axes[0].set_ylabel("held-out return (dotted: random)", fontsize=8)
    _source(fig, SAC, bottom=0.16)
    return fig


def semantic_reward():
    """Held-out success per seed: warm start, RL on the true reward, RL on the CLIP reward alone."""
    data = load(SEMANTIC)
    arms = [
        ("warm start", data["success_start"]["per_seed"], COLORS["baseline"]),
        ("RL, true reward", data["success_true_reward"]["per_seed"], COLORS["ceiling"]),
        ("RL, CLIP reward alone", data["success_clip_reward"]["per_seed"], COLORS["other"]),
    ]
    fig, (ax,) = figure(6.0, 3.4)
    for i, (_label, values, color) in enumerate(arms):
        ax.bar(i, statistics.fmean(values), width=0.6, color=color, alpha=0.35)
        ax.scatter([i + d for d in OFFSETS], values, color=color, s=18, zorder=3)
    ax.set_xticks(range(len(arms)), [a[0] for a in arms], fontsize=8)
    ax.set_ylabel("held-out success (bar: mean, dots: seeds 0-2)", fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_title("reach: RL on a tiny CLIP's reward (6bfd848)", fontsize=9)
    _source(fig, SEMANTIC, bottom=0.16)
    return fig


def semantic_shaping():
    """Held-out success against env steps per seed: sparse success alone, plus the CLIP's shaping,
    the dense task reward; the 0.85 level dotted."""
    data = load(SHAPING)["held_out"]
    arms = {
        "sparse": ("sparse success", COLORS["baseline"]),
        "shaped": ("sparse + CLIP shaping", COLORS["mmrl"]),
        "dense": ("dense task reward", COLORS["ceiling"]),
    }
    fig, axes = figure(10.0, 3.4, ncols=len(data["seeds"]))
    for ax, i, seed in zip(axes, range(len(data["seeds"])), data["seeds"]):
        for arm, (label, color) in arms.items():
            curve = data["curves"][arm][i]
            ax.plot([p["env_steps"] / 1e3 for p in curve], [p["success"] for p in curve], color=color, label=label)
        ax.axhline(data["level"], color="#666", ls=":", lw=1)
        ax.set_title(f"seed {seed}", fontsize=9)
        ax.set_xlabel("env steps (thousands)", fontsize=8)
        ax.set_ylim(0, 1.02)
    axes[0].set_ylabel("held-out success", fontsize=8)
    axes[0].legend(fontsize=7, loc="lower right")
    _source(fig, SHAPING, bottom=0.2)
    return fig


def _curves(ax, runs, variants: dict) -> None:
    """Held-out return against env steps, one line per run (style per seed), one colour per variant."""
    styles = {}
    for run in runs:
        if run["variant"] not in variants:
            continue
        label, color = variants[run["variant"]]
        ls = styles.setdefault(run["seed"], ["-", "--", ":"][len(styles) % 3])
        xs = [s / 1e6 for s, _ in run["evals"]]
        ys = [r for _, r in run["evals"]]
        first = run["seed"] == min(r["seed"] for r in runs if r["variant"] == run["variant"])
        ax.plot(xs, ys, color=color, ls=ls, lw=1.4, label=label if first else None)
    ax.set_xlabel("env steps (millions)")
    ax.set_ylabel("held-out return (validation episodes)", fontsize=8)


def ant_noise_sweep_curves():
    """Ant-v5 validation seeds: the old fixed Flow-SDE noise against annealed noise, Flow-Noise and a Gaussian."""
    data = load(ANT_NOISE)
    fig, (ax,) = figure(7.2, 3.8)
    _curves(
        ax,
        data["runs"],
        {
            "template": ("fixed Flow-SDE noise a = 2 (the old template)", COLORS["other"]),
            "anneal02": ("noise_level_final 0.2", COLORS["third"]),
            "noise": ("Flow-Noise, std in [0.02, 0.5]", COLORS["baseline"]),
            "gaussian": ("Gaussian policy (reference)", COLORS["ceiling"]),
        },
    )
    ax.legend(fontsize=7)
    ax.set_title("Ant-v5, validation seeds 100-102 (line style), stopped at 450 s (H200's CPU cores)", fontsize=9)
    _source(fig, ANT_NOISE, bottom=0.16)
    return fig


def ant_std_sweep_curves():
    """Ant-v5 validation seeds 100 / 101: the state template's initial action std."""
    data = load(ANT_STD)
    fig, (ax,) = figure(7.2, 3.8)
    _curves(
        ax,
        data["ant_h200"]["runs"],
        {
            "template": ("initial std 1 (then the template)", COLORS["other"]),
            "lsi05": ("std 0.61", COLORS["third"]),
            "lsi10": ("std 0.37", COLORS["mmrl"]),
            "lsi15": ("std 0.22", COLORS["ceiling"]),
        },
    )
    ax.legend(fontsize=7)
    ax.set_title("Ant-v5, validation seeds 100 (solid) / 101 (dashed), stopped at 530 s", fontsize=9)
    _source(fig, ANT_STD, bottom=0.16)
    return fig


def quickstart_h200_curves():
    """Training success per RL iteration of the quickstart's three seeds on one H200 (the benchmark's
    log prints one line per seed: ``... seed N: train success per iteration [...]``)."""
    import ast
    import re

    text = (RESULTS / H200_QUICKSTART).read_text()
    curves = {
        int(m.group(1)): ast.literal_eval(m.group(2))
        for m in re.finditer(r"seed (\d+): train success per iteration (\[[^\]]*\])", text)
    }
    final = {
        int(m.group(1)): float(m.group(2)) for m in re.finditer(r"seed (\d+): warm start [0-9.]+ -> RL ([0-9.]+)", text)
    }
    fig, (ax,) = figure(6.4, 3.4)
    for (seed, ys), ls in zip(sorted(curves.items()), ["-", "--", ":"]):
        ax.plot(
            range(1, len(ys) + 1),
            ys,
            color=COLORS["mmrl"],
            ls=ls,
            lw=1.4,
            label=f"seed {seed} (held-out at the end: {final[seed]:.3f})",
        )
    ax.set_xlabel("RL iteration")
    ax.set_ylabel("training success (per iteration)", fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=7)
    ax.set_title("Quickstart on one H200 (the tree of 7ebdba9): training success", fontsize=9)
    _source(fig, H200_QUICKSTART, bottom=0.18)
    return fig


PLOTS = {
    "vla_quickstart_h200_curves.png": quickstart_h200_curves,
    "vla_vs_sb3_ratios.png": vs_sb3_ratios,
    "vla_ant_ratio_history.png": ant_ratio_history,
    "vla_quickstart_per_seed.png": quickstart_per_seed,
    "vla_sample_efficiency_reach.png": sample_efficiency_reach,
    "vla_sac_vs_sb3.png": sac_vs_sb3,
    "vla_semantic_reward.png": semantic_reward,
    "vla_semantic_shaping.png": semantic_shaping,
    "vla_ant_noise_sweep_curves.png": ant_noise_sweep_curves,
    "vla_ant_std_sweep_curves.png": ant_std_sweep_curves,
}
