"""Build `zoom_vqa`: a scene whose answer is only legible through the ``zoom`` tool (the multi-turn tool
task of `simulators.tool_env` with ``env: zoom``). Nothing is downloaded. Two questions (``question``):

- ``"color"`` (the demo's, `configs/vlm_zoom_tools.yaml`; needs ``grid=2``): one shape in each quarter of
  the scene, four different colours, and "What color is the object in the top left quarter? Answer
  red, green, blue, yellow or purple." The environment's overview is grayscale (``env_kwargs: {gray:
  true}``) and every object's colour is scaled to a luma drawn from `LUMA` whatever its hue, so the
  overview shows where the objects are and nothing of their colours; ``zoom`` returns the colour
  crop. Where to zoom is named by the question (the quarter), what to answer is read from the crop.
  Splits: different scenes (the split is part of each sample's random stream).
- ``"shape"``: one small shape, whose shape is only legible at full resolution (below).

``build(num_samples=256, split="train", seed=0, image_size=64, object_size=7, grid=0, question="shape")`` ->
``{"prompt": [str], "images": [[uint8 [S, S, 3]]], "meta": [dict], "solution": [str]}`` (the `vlm_records` format). The
question ("What shape is the small red object? Answer circle, square or triangle.") needs the
object's shape: the ``zoom`` environment shows the image at 16 px, where a 7 px shape is a 2 px
blob, and its ``zoom(x, y)`` tool returns the full-resolution crop. The object lies anywhere
(``grid=0``) or, with ``grid=g``, anywhere inside one of the g x g cells of the scene, and the
demonstrator zooms at the centre of that cell (the demo's setting: where to zoom is then one of
g x g places, which a tiny model can learn to see). Splits: ``eval`` holds the
(colour, shape) combinations `HELD_OUT` and ``validation`` those of `VALIDATION` (one per shape
each), which ``train`` never shows, so colour alone cannot answer them. Sample i depends only on
(seed, split, i) and the options.

With ``question="color"`` each quarter holds one shape (circle, square or triangle) of side drawn from
``object_size`` to the quarter's side less twice `MARGIN`, at least `MARGIN` px inside its quarter
(so the crop of a call at the quarter's centre holds all of it and nothing of the others).

Demonstrations (``demos=True``, SFT rows for `mmrl.policies.vlm.VLMPolicy.warm_start_batch`): two
rows per question, rendered by `simulators.tool_env.ZoomEnv` itself (configured as the RL
simulator's ``env_kwargs``: ``sim_kwargs``, which the trainer's warm start passes): (a) the first
turn's conversation (the question with the small image) and the tool schemas -> ``<tool_call>`` of
``zoom`` at the object's centre, or its cell's with ``grid`` (each coordinate moved by up to
``jitter`` small-image pixels; with probability ``wrong_zoom`` at a uniformly random point
instead: a noisy demonstrator; question "color": with probability ``wrong_quarter`` at the centre of
another quarter, drawn uniformly (``wrong_quarter_kind="any"``) or the one with left and right
swapped ("mirror"), and then answering the colour that crop shows: a sloppy demonstrator,
consistent with what it sees, whom RL can outdo by zooming where it is asked), (b) that
conversation, the call and the tool's crop -> the answer (with probability ``guess_answer`` one such
row per word of the question's vocabulary, `COLORS` or `SHAPES`, instead: a demonstrator who shows
the protocol, calling the tool and answering in one word, but not the reading, so the policy SFT
trains answers every word alike, however often it sees the question, and RL has to learn the
reading from the reward). With the zoom tool switched off
(``env_kwargs: {offer_zoom: false}``, the no-tool baseline) one row per question: the question with
the small image -> the answer. Extra keys: ``messages`` and ``tools``
per row; ``meta`` gains ``turn`` (0 or 1) and ``zoom`` ([x, y] of the call). The demonstrator's
draws have their own random stream: the questions are those of ``demos=False``.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import torch

try:
    from mmrl.registry import adapter
except ImportError:  # run as a script from outside the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from mmrl.registry import adapter

_shapes = adapter("rewards.shapes")
COLORS, SHAPES = tuple(_shapes.COLORS), tuple(_shapes.SHAPES)
#: simulator the demonstrations (``demos=True``) are rendered for: the trainer's warm start passes its
#: configured ``sim.kwargs`` as ``sim_kwargs`` when the experiment runs in it
SIMULATOR = "tool_env"
SPLITS = ("train", "validation", "eval")
#: (colour, shape) combinations only the eval split shows: one per shape
HELD_OUT = (("blue", "circle"), ("yellow", "square"), ("purple", "triangle"))
#: (colour, shape) combinations only the validation split shows (settings are chosen there): one per shape
VALIDATION = (("green", "circle"), ("red", "square"), ("blue", "triangle"))
QUESTIONS = ("shape", "color")
#: question "color": the luma range (ITU-R BT.601, 0-255) every object's colour is scaled to, whatever its hue
LUMA = (110.0, 150.0)
#: question "color": px between an object and its quarter's edges
MARGIN = 3
#: question "color": the quarters, row-major, as the question names them
QUARTERS = ("top left", "top right", "bottom left", "bottom right")
#: where ``wrong_quarter``'s sloppy call lands: "any" other quarter (uniformly), or the "mirror" one
#: (left and right swapped: a demonstrator who confuses them)
WRONG_QUARTER_KINDS = ("any", "mirror")


def combos(split: str) -> list[tuple[str, str]]:
    """The (colour, shape) combinations of ``split``."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    every = [(c, s) for c in COLORS for s in SHAPES]
    held = {"eval": HELD_OUT, "validation": VALIDATION}
    if split in held:
        return [x for x in every if x in held[split]]
    return [x for x in every if x not in HELD_OUT and x not in VALIDATION]


def build(
    num_samples: int = 256,
    split: str = "train",
    seed: int = 0,
    image_size: int = 64,
    object_size: int = 7,
    grid: int = 0,
    demos: bool = False,
    jitter: int = 0,
    wrong_zoom: float = 0.0,
    sim_kwargs: dict | None = None,
    question: str = "shape",
    balanced: bool = False,
    wrong_quarter: float = 0.0,
    guess_answer: float = 0.0,
    wrong_quarter_kind: str = "any",
) -> dict:
    """See the module docstring."""
    if question not in QUESTIONS:
        raise ValueError(f"question must be one of {QUESTIONS}, got {question!r}")
    if question == "color":
        data = color_questions(num_samples, split, seed, image_size, object_size, grid, balanced)
    else:
        if balanced:
            raise ValueError("balanced cycles the asked colour: it needs question='color'")
        data = shape_questions(num_samples, split, seed, image_size, object_size, grid)
    if wrong_quarter and question != "color":
        raise ValueError("wrong_quarter zooms at another quarter's object: it needs question='color'")
    if demos:
        return demonstrations(
            data,
            seed,
            jitter,
            wrong_zoom,
            sim_kwargs,
            image_size,
            object_size,
            grid,
            question,
            wrong_quarter,
            guess_answer,
            wrong_quarter_kind,
        )
    if jitter or wrong_zoom or wrong_quarter or guess_answer:
        raise ValueError("jitter, wrong_zoom, wrong_quarter and guess_answer shape the demonstrations: set demos=True")
    return data


def at_luma(rgb: torch.Tensor, y: float, luma) -> torch.Tensor:
    """``rgb`` (float [3]) moved to luma ``y``, its hue kept: scaled toward black when brighter, mixed
    toward white when darker (luma is linear in rgb, so both land exactly on ``y``)."""
    now = float(luma(rgb))
    if now >= y:
        return rgb * (y / now)
    return rgb + (y - now) / (255.0 - now) * (255.0 - rgb)


def color_questions(
    num_samples: int, split: str, seed: int, image_size: int, object_size: int, grid: int, balanced: bool = False
) -> dict:
    """Question "color" (see the module docstring): four shapes, one per quarter, of four colours.
    ``balanced``: question i asks for colour ``COLORS[i % 5]`` (in a random quarter), so a few
    demonstrations teach every answer alike; otherwise the asked quarter, and so its colour, is drawn."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    cell = image_size // 2
    if grid != 2 or num_samples < 1 or not 3 <= object_size <= cell - 2 * MARGIN:
        raise ValueError(
            f"question 'color' puts one object in each quarter: it needs grid=2 (got {grid}), num_samples >= 1 "
            f"(got {num_samples}) and object_size in 3..{cell - 2 * MARGIN} (got {object_size})"
        )
    from mmrl.data import builder_module

    render = builder_module("shapes").render
    luma = adapter("simulators.qa").luma  # the zoom environment's grayscale
    palette = torch.tensor([_shapes.COLORS[c] for c in COLORS], dtype=torch.float32)
    rgb, shape, box, meta = [], [], [], []
    for i in range(num_samples):
        rng = random.Random(f"zoom_vqa-color|{split}|{seed}|{i}")
        colors = rng.sample(range(len(COLORS)), 4)  # quarter -> colour index, all different
        sides = [rng.randint(object_size, cell - 2 * MARGIN) for _ in range(4)]
        corners = [
            [
                (q % 2) * cell + rng.randint(MARGIN, cell - MARGIN - side),
                (q // 2) * cell + rng.randint(MARGIN, cell - MARGIN - side),
            ]
            for q, side in enumerate(sides)
        ]
        lumas = [rng.uniform(*LUMA) for _ in range(4)]
        shapes = [rng.randrange(len(SHAPES)) for _ in range(4)]
        asked = rng.randrange(4)
        if balanced:  # the asked quarter gets colour i % 5 (swapped in, the four stay distinct)
            want = i % len(COLORS)
            if want in colors:
                j = colors.index(want)
                colors[j], colors[asked] = colors[asked], colors[j]
            else:
                colors[asked] = want
        rgb.append(torch.stack([at_luma(palette[c], y, luma) for c, y in zip(colors, lumas)]).round())
        shape.append(shapes)
        box.append([[x, y, side] for (x, y), side in zip(corners, sides)])
        (x0, y0), side = corners[asked], sides[asked]
        c = COLORS[colors[asked]]
        meta.append(
            {
                "answer": c,
                "color": c,
                "shape": SHAPES[shapes[asked]],
                "box": [x0, y0, x0 + side, y0 + side],
                "quarter": QUARTERS[asked],
                "colors": [COLORS[k] for k in colors],
                "split": split,
                "index": i,
            }
        )
    images = render(
        torch.stack(rgb).long(),
        torch.tensor(shape),
        torch.tensor(box),
        torch.ones(num_samples, 4, dtype=torch.bool),
        image_size,
    )
    choices = ", ".join(COLORS[:-1]) + f" or {COLORS[-1]}"
    prompts = [f"What color is the object in the {m['quarter']} quarter? Answer {choices}." for m in meta]
    return {"prompt": prompts, "images": [[im] for im in images], "meta": meta, "solution": [m["answer"] for m in meta]}


def shape_questions(num_samples: int, split: str, seed: int, image_size: int, object_size: int, grid: int) -> dict:
    """Question "shape" (see the module docstring): one small shape of a (colour, shape) of ``split``."""
    if num_samples < 1 or not 3 <= object_size <= image_size // 2:
        raise ValueError(
            f"num_samples must be >= 1 and object_size in 3..image_size/2, got {num_samples}, {object_size}"
        )
    if grid < 0 or (grid and object_size > image_size // grid):
        raise ValueError(
            f"grid must be 0 (anywhere) or a number of cells per side whose cells hold the object: grid {grid}, "
            f"image_size {image_size}, object_size {object_size} (cells of image_size // grid px)"
        )
    from mmrl.data import builder_module

    render = builder_module("shapes").render
    pool = combos(split)
    color, shape, box, meta = [], [], [], []
    for i in range(num_samples):
        rng = random.Random(f"zoom_vqa|{split}|{seed}|{i}")
        c, s = rng.choice(pool)
        if grid:  # anywhere inside a cell
            cell = image_size // grid
            x0, y0 = (rng.randrange(grid) * cell + rng.randrange(cell - object_size + 1) for _ in range(2))
        else:
            x0, y0 = rng.randrange(image_size - object_size + 1), rng.randrange(image_size - object_size + 1)
        color.append(COLORS.index(c))
        shape.append(SHAPES.index(s))
        box.append([x0, y0, object_size])
        meta.append(
            {
                "answer": s,
                "color": c,
                "shape": s,
                "box": [x0, y0, x0 + object_size, y0 + object_size],
                "split": split,
                "index": i,
            }
        )
    images = render(
        torch.tensor(color)[:, None],
        torch.tensor(shape)[:, None],
        torch.tensor(box)[:, None],
        torch.ones(num_samples, 1, dtype=torch.bool),
        image_size,
    )
    prompts = [f"What shape is the small {m['color']} object? Answer circle, square or triangle." for m in meta]
    return {"prompt": prompts, "images": [[im] for im in images], "meta": meta, "solution": [m["answer"] for m in meta]}


def demonstrations(
    data: dict,
    seed: int,
    jitter: int,
    wrong_zoom: float,
    sim_kwargs: dict | None,
    image_size: int,
    object_size: int,
    grid: int = 0,
    question: str = "shape",
    wrong_quarter: float = 0.0,
    guess_answer: float = 0.0,
    wrong_quarter_kind: str = "any",
) -> dict:
    """The SFT rows of ``data``'s questions (see the module docstring), in order: two per question, the
    call and the answer (no call where the environment offers no zoom tool; one answer row per word of
    the vocabulary for a question ``guess_answer`` draws)."""
    import inspect
    import json

    from mmrl.tools import CALL_CLOSE, CALL_OPEN

    if jitter < 0 or not all(0.0 <= p <= 1.0 for p in (wrong_zoom, wrong_quarter, guess_answer)):
        raise ValueError(
            f"jitter must be >= 0, wrong_zoom, wrong_quarter and guess_answer in [0, 1], got {jitter}, "
            f"{wrong_zoom}, {wrong_quarter}, {guess_answer}"
        )
    if wrong_quarter_kind not in WRONG_QUARTER_KINDS:
        raise ValueError(f"wrong_quarter_kind must be one of {WRONG_QUARTER_KINDS}, got {wrong_quarter_kind!r}")
    sim_kwargs = dict(sim_kwargs or {})
    if sim_kwargs.get("env", "zoom") != "zoom":
        raise ValueError(f"zoom_vqa demonstrations are for the zoom environment, not env {sim_kwargs['env']!r}")
    asked = {"image_size": image_size, "object_size": object_size, "grid": grid, "question": question}
    # the RL simulator's questions, its defaults included: demonstrations of one question for a run of another
    # would teach the wrong task in silence
    defaults = {k: inspect.signature(build).parameters[k].default for k in asked}
    rl_kwargs = {**defaults, **(sim_kwargs.get("dataset_kwargs") or {})} if sim_kwargs.get("dataset_kwargs") else {}
    rl = {k: rl_kwargs[k] for k in asked if k in rl_kwargs and rl_kwargs[k] != asked[k]}
    if rl:
        raise ValueError(f"the demonstrations' {asked} differ from the RL simulator's dataset_kwargs {rl}")
    env = adapter("simulators.tool_env").ZoomEnv(**dict(sim_kwargs.get("env_kwargs") or {}))
    tools = [t.schema for t in env.tools()]
    shown = tools if sim_kwargs.get("schemas_in_prompt", True) else []  # the tools turn of the rows' prompts
    size = env.show_size
    out: dict[str, list] = {k: [] for k in ("prompt", "images", "meta", "solution", "messages", "tools")}
    for prompt, imgs, m, answer in zip(data["prompt"], data["images"], data["meta"], data["solution"]):
        rng = random.Random(f"zoom_vqa-demos|{m['split']}|{seed}|{m['index']}")
        x0, y0, x1, y1 = m["box"]
        h, w = imgs[0].shape[:2]
        said, looked = answer, m.get("quarter")
        if wrong_quarter and rng.random() < wrong_quarter:  # a sloppy look at another quarter, read as it is
            asked_q = QUARTERS.index(m["quarter"])
            others = [k for k in range(len(QUARTERS)) if k != asked_q]
            q = asked_q ^ 1 if wrong_quarter_kind == "mirror" else rng.choice(others)  # ^ 1: the other column
            x0, y0 = (q % 2) * (image_size // 2), (q // 2) * (image_size // 2)  # in that quarter: its centre below
            said, looked = m["colors"][q], QUARTERS[q]
        if grid:  # the centre of the object's cell
            cell = image_size // grid
            x, y = (int((v // cell + 0.5) * cell * size / image_size) for v in (x0, y0))
        else:  # the object's centre
            x, y = int((x0 + x1) / 2 * size / w), int((y0 + y1) / 2 * size / h)
        x = min(max(x + rng.randint(-jitter, jitter), 0), size - 1)
        y = min(max(y + rng.randint(-jitter, jitter), 0), size - 1)
        if rng.random() < wrong_zoom:
            x, y = rng.randrange(size), rng.randrange(size)
        saids = [said]
        if guess_answer and rng.random() < guess_answer:  # every word of the vocabulary, one row each
            saids = list(COLORS if question == "color" else SHAPES)
        call = f"{CALL_OPEN}\n{json.dumps({'name': 'zoom', 'arguments': {'x': x, 'y': y}})}\n{CALL_CLOSE}"
        first = env.reset({"prompt": prompt, "images": imgs, "videos": [], "meta": m, "solution": answer})
        if not tools:  # the zoom tool is off (the no-tool baseline): answer from the small image
            rows = [(0, first, s) for s in saids]
        else:
            second = [*first, {"role": "assistant", "content": call}]
            second += env.step(list(second)).messages
            rows = [(0, first, call), *((1, second, s) for s in saids)]
        for turn, messages, target in rows:
            out["prompt"].append(prompt)
            out["images"].append(imgs)
            extra = {
                **({"looked": looked} if wrong_quarter else {}),
                **({"guessed": len(saids) > 1} if guess_answer else {}),
            }
            out["meta"].append({**m, "turn": turn, "zoom": [x, y], **extra})
            out["solution"].append(target)
            out["messages"].append(messages)
            out["tools"].append(list(shown))
    return out


if __name__ == "__main__":
    data = build(num_samples=4)
    for p, m in zip(data["prompt"], data["meta"]):
        print(p, "->", m["answer"], m["box"])
