"""zoom_vqa: disjoint splits, and the demonstrations (``demos=True``) of the multi-turn zoom task: each
row's conversation is what `simulators.tool_env.ToolEnvSim` shows the policy at that turn, the
demonstrated call zooms onto the object, and the questions are those of the plain dataset."""

import json

import pytest
import torch

from mmrl.data import builder_module, load_dataset
from mmrl.tools import parse_tool_calls

zoom = builder_module("zoom_vqa")


def test_the_splits_hold_disjoint_combinations_and_samples_keep_to_theirs():
    pools = {s: set(zoom.combos(s)) for s in zoom.SPLITS}
    assert pools["train"].isdisjoint(pools["validation"]) and pools["train"].isdisjoint(pools["eval"])
    assert pools["validation"].isdisjoint(pools["eval"])
    assert len(set().union(*pools.values())) == len(zoom.COLORS) * len(zoom.SHAPES)
    for split in ("validation", "eval"):  # one combination per shape: colour alone cannot answer
        assert sorted(s for _, s in pools[split]) == sorted(zoom.SHAPES)
    for split, pool in pools.items():
        data = load_dataset("zoom_vqa", num_samples=40, split=split)
        assert {(m["color"], m["shape"]) for m in data["meta"]} <= pool


def demo_rows(**kw):
    return load_dataset("zoom_vqa", num_samples=6, demos=True, **kw)


def test_demonstrations_keep_the_questions_and_give_two_turns_each():
    plain, demos = load_dataset("zoom_vqa", num_samples=6), demo_rows(jitter=1)
    assert len(demos["solution"]) == 12
    assert demos["prompt"][::2] == plain["prompt"] and demos["prompt"][1::2] == plain["prompt"]
    assert [m["box"] for m in demos["meta"][::2]] == [m["box"] for m in plain["meta"]]
    assert demos["solution"][1::2] == plain["solution"]  # (b): the answer
    for call, m in zip(demos["solution"][::2], demos["meta"][::2]):  # (a): one zoom call
        (c,) = parse_tool_calls(call)
        assert c.name == "zoom" and [c.arguments["x"], c.arguments["y"]] == m["zoom"]
    assert all(t[0]["function"]["name"] == "zoom" for t in demos["tools"])
    with pytest.raises(ValueError, match="demos=True"):
        load_dataset("zoom_vqa", num_samples=2, jitter=1)


def object_pixels(image: torch.Tensor) -> int:
    return int((image.amax(-1) > 60).sum())  # the shape's pixels on the black scene


@pytest.mark.parametrize("jitter", [0, 1])
def test_the_demonstrated_call_shows_the_whole_object(jitter):
    demos = demo_rows(jitter=jitter)
    for messages, image in zip(demos["messages"][1::2], demos["images"][1::2]):
        crop = messages[-1]["content"][0]["image"]  # the tool's result
        assert messages[-1]["role"] == "tool" and crop.shape == (24, 24, 3)
        assert object_pixels(crop) == object_pixels(image[0]) > 0
    for m in demos["meta"]:  # the call names the small-image pixel of the object's centre, up to the jitter
        centre = [(m["box"][k] + m["box"][k + 2]) / 2 * 16 / 64 for k in (0, 1)]
        assert all(abs(z - int(c)) <= jitter for z, c in zip(m["zoom"], centre))
        assert jitter or m["zoom"] == [int(c) for c in centre]


def test_a_noisy_demonstrator_misses_some_of_the_time():
    demos = load_dataset("zoom_vqa", num_samples=40, demos=True, wrong_zoom=0.5)
    crops = [m[-1]["content"][0]["image"] for m in demos["messages"][1::2]]
    whole = [object_pixels(c) == object_pixels(im[0]) for c, im in zip(crops, demos["images"][1::2])]
    assert 0.2 < 1 - sum(whole) / len(whole) < 0.6


def test_each_demonstration_is_the_conversation_the_simulator_shows_at_that_turn():
    from mmrl.simulator import Completions
    from simulators.tool_env import ToolEnvSim

    env_kwargs = {"show_size": 12, "crop_size": 20, "system_prompt": "Look closely."}
    sim_kwargs = {"env": "zoom", "env_kwargs": env_kwargs, "dataset_kwargs": {"num_samples": 6}}
    demos = load_dataset("zoom_vqa", num_samples=6, demos=True, jitter=1, sim_kwargs=sim_kwargs)
    sim = ToolEnvSim(
        num_envs=3, env="zoom", env_kwargs=env_kwargs, dataset="zoom_vqa", dataset_kwargs={"num_samples": 6}
    )
    obs = sim.reset([0, 1, 2])
    rows = [2 * int(q) for q in sim._idx]
    for i, r in enumerate(rows):
        same(obs.messages[i], demos["messages"][r])
        assert obs.tools[i] == demos["tools"][r]
    res = sim.step_chunk(Completions([demos["solution"][r] for r in rows], [20] * 3))
    assert not res.done.any()
    for i, r in enumerate(rows):
        same(res.obs.messages[i], demos["messages"][r + 1])


def same(a: list[dict], b: list[dict]) -> None:
    """Two conversations are equal, images compared pixel for pixel."""
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys() and x["role"] == y["role"]
        if isinstance(x["content"], str):
            assert x["content"] == y["content"]
            continue
        assert [c["type"] for c in x["content"]] == [c["type"] for c in y["content"]]
        for c, d in zip(x["content"], y["content"]):
            if c["type"] == "image":
                assert torch.equal(c["image"], d["image"])
            else:
                assert json.dumps(c, sort_keys=True) == json.dumps(d, sort_keys=True)


def test_demonstrations_refuse_an_rl_simulator_they_do_not_match():
    with pytest.raises(ValueError, match="image_size"):
        demo_rows(sim_kwargs={"env": "zoom", "dataset_kwargs": {"image_size": 48}})
    with pytest.raises(ValueError, match="zoom environment"):
        demo_rows(sim_kwargs={"env": "tools"})


def test_the_tool_config_warm_starts_on_demonstrations_rendered_for_its_own_simulator():
    from mmrl.data import declared_kwargs, recorded_in
    from mmrl.experiment import load_experiment

    cfg = load_experiment("configs/vlm_zoom_tools.yaml")
    assert cfg.warm_start.dataset == "zoom_vqa" and cfg.warm_start.kwargs["demos"] is True
    assert recorded_in("zoom_vqa") == cfg.sim.type  # so the trainer passes sim.kwargs as sim_kwargs
    assert "sim_kwargs" in declared_kwargs("zoom_vqa", sim_kwargs={}, chunk_size=1)
    scenes = ("question", "grid", "object_size")  # the demonstrations' scenes are the RL questions' scenes
    assert {k: cfg.warm_start.kwargs[k] for k in scenes} == {k: cfg.sim.kwargs["dataset_kwargs"][k] for k in scenes}


def test_on_a_grid_each_object_sits_whole_in_one_cell_and_the_call_zooms_at_that_cell():
    data = load_dataset("zoom_vqa", num_samples=200, grid=4)
    cells, offsets = set(), set()
    for m in data["meta"]:
        x0, y0, x1, y1 = m["box"]
        assert (x0 // 16, y0 // 16) == ((x1 - 1) // 16, (y1 - 1) // 16)  # inside one 16 px cell
        cells.add((x0 // 16, y0 // 16))
        offsets.add((x0 % 16, y0 % 16))
    assert len(cells) == 16 and len(offsets) > 20  # every cell, and anywhere inside it
    demos = load_dataset("zoom_vqa", num_samples=20, grid=4, demos=True)
    for m, messages, image in zip(demos["meta"][::2], demos["messages"][1::2], demos["images"][1::2]):
        assert m["zoom"] == [4 * (m["box"][0] // 16) + 2, 4 * (m["box"][1] // 16) + 2]  # the cell's centre
        assert object_pixels(messages[-1]["content"][0]["image"]) == object_pixels(image[0]) > 0
    with pytest.raises(ValueError, match="grid"):
        load_dataset("zoom_vqa", num_samples=2, grid=10)  # 6 px cells cannot hold a 7 px object


def test_without_the_zoom_tool_the_demonstrations_answer_from_the_small_image():
    from simulators.tool_env import ToolEnvSim

    plain = load_dataset("zoom_vqa", num_samples=6)
    sim_kwargs = {"env": "zoom", "env_kwargs": {"offer_zoom": False}}
    demos = load_dataset("zoom_vqa", num_samples=6, demos=True, sim_kwargs=sim_kwargs)
    assert demos["solution"] == plain["solution"] and demos["tools"] == [[]] * 6  # one row: the answer
    sim = ToolEnvSim(num_envs=2, env="zoom", env_kwargs={"offer_zoom": False}, dataset="zoom_vqa")
    obs = sim.reset([0, 1])
    assert obs.tools == [[], []] and "zoom" not in obs.messages[0][-1]["content"][-1]["text"]
    assert obs.messages[0][-1]["content"][0]["image"].shape == (16, 16, 3)
    same(obs.messages[0], load_dataset("zoom_vqa", demos=True, sim_kwargs=sim_kwargs)["messages"][int(sim._idx[0])])


COLOR = {"question": "color", "grid": 2}
COLOR_SIM = {"env": "zoom", "env_kwargs": {"gray": True, "crop_size": 32}, "dataset_kwargs": COLOR}


@pytest.mark.parametrize("balanced", [False, True])
def test_a_color_question_asks_one_of_four_differently_coloured_objects_one_per_quarter(balanced):
    """Also ``balanced``: the asked colours cycle through the palette (few demonstrations teach every
    answer), each scene still of four different colours."""
    from simulators.qa import luma

    data = load_dataset("zoom_vqa", num_samples=60, balanced=balanced, **COLOR)
    asked = set()
    for prompt, m, image in zip(data["prompt"], data["meta"], data["images"]):
        assert len(set(m["colors"])) == 4 and m["answer"] == m["colors"][zoom.QUARTERS.index(m["quarter"])]
        assert m["quarter"] in prompt and m["answer"] not in prompt.split("?")[0]
        x0, y0, x1, y1 = m["box"]
        q = zoom.QUARTERS.index(m["quarter"])
        qx, qy = (q % 2) * 32, (q // 2) * 32  # at least MARGIN px inside its quarter
        assert (
            qx + zoom.MARGIN <= x0 < x1 <= qx + 32 - zoom.MARGIN
            and qy + zoom.MARGIN <= y0 < y1 <= qy + 32 - zoom.MARGIN
        )
        pixels = image[0][y0:y1, x0:x1].reshape(-1, 3)
        pixels = pixels[pixels.amax(-1) > 0]  # the object's own pixels (the scene is black)
        assert len(pixels) > 0 and (pixels == pixels[0]).all()
        # its colour's luma is drawn from LUMA whatever its hue: the grayscale overview does not tell colours apart
        assert zoom.LUMA[0] - 1 <= float(luma(pixels[0])) <= zoom.LUMA[1] + 1
        # and it is the answer's palette colour at that luma, not another's
        y = float(luma(pixels[0]))
        at = {
            c: zoom.at_luma(torch.tensor(rgb, dtype=torch.float32), y, luma) for c, rgb in zoom._shapes.COLORS.items()
        }
        assert min(at, key=lambda c: float((at[c] - pixels[0]).abs().max())) == m["answer"]
        assert float((at[m["answer"]] - pixels[0]).abs().max()) <= 1.0
        asked.add((m["quarter"], m["answer"]))
    assert len(asked) >= 15  # every quarter asked, with most colours
    answers = [m["answer"] for m in data["meta"]]
    assert (answers == [zoom.COLORS[i % len(zoom.COLORS)] for i in range(60)]) == balanced
    if balanced:
        with pytest.raises(ValueError, match="balanced"):
            load_dataset("zoom_vqa", num_samples=2, balanced=True)
    with pytest.raises(ValueError, match="grid=2"):
        load_dataset("zoom_vqa", num_samples=2, question="color")
    with pytest.raises(ValueError, match="question must be one of"):
        load_dataset("zoom_vqa", num_samples=2, question="size")


def test_the_color_demonstration_zooms_at_the_asked_quarter_and_its_crop_shows_that_object_alone():
    plain = load_dataset("zoom_vqa", num_samples=12, **COLOR)
    demos = load_dataset("zoom_vqa", num_samples=12, demos=True, sim_kwargs=COLOR_SIM, **COLOR)
    assert demos["prompt"][::2] == plain["prompt"] and demos["solution"][1::2] == plain["solution"]
    for call, m, messages, image in zip(
        demos["solution"][::2], demos["meta"][::2], demos["messages"][1::2], demos["images"][1::2]
    ):
        (c,) = parse_tool_calls(call)
        q = zoom.QUARTERS.index(m["quarter"])
        assert [c.arguments["x"], c.arguments["y"]] == [4 + 8 * (q % 2), 4 + 8 * (q // 2)]  # the quarter's centre
        overview, crop = messages[0]["content"][0]["image"], messages[-1]["content"][0]["image"]
        assert (overview == overview[..., :1]).all()  # grayscale
        x0, y0, x1, y1 = m["box"]
        colour = image[0][(y0 + y1) // 2, (x0 + x1) // 2]
        lit = crop.reshape(-1, 3)[crop.reshape(-1, 3).amax(-1) > 0]
        assert len(lit) == int((image[0][y0:y1, x0:x1].amax(-1) > 0).sum()) > 0 and (lit == colour).all()
    with pytest.raises(ValueError, match="question"):  # demonstrations of one question for a run of the other
        load_dataset(
            "zoom_vqa", num_samples=2, demos=True, sim_kwargs={"env": "zoom", "dataset_kwargs": {"grid": 2}}, **COLOR
        )


def called_quarter(call: str):
    """The index in QUARTERS of the quarter a demonstrated call zooms at (16 px overview), and the call."""
    (c,) = parse_tool_calls(call)
    return int(c.arguments["x"] >= 8) + 2 * int(c.arguments["y"] >= 8), c


def test_a_sloppy_demonstrator_looks_at_another_quarter_and_answers_what_its_crop_shows():
    """``wrong_quarter``: some calls land at another quarter's centre, and the answer taught after
    such a call is the colour of the object that crop shows (consistent with what it saw), not the
    asked one; the others are the plain demonstrations, call for call."""
    plain = load_dataset("zoom_vqa", num_samples=40, demos=True, sim_kwargs=COLOR_SIM, **COLOR)
    demos = load_dataset("zoom_vqa", num_samples=40, demos=True, sim_kwargs=COLOR_SIM, wrong_quarter=0.5, **COLOR)
    wrong = 0
    for k, (call, said, m, messages) in enumerate(
        zip(demos["solution"][::2], demos["solution"][1::2], demos["meta"][::2], demos["messages"][1::2])
    ):
        q, c = called_quarter(call)
        assert [c.arguments["x"], c.arguments["y"]] == [4 + 8 * (q % 2), 4 + 8 * (q // 2)]
        assert said == m["colors"][q] and m["looked"] == zoom.QUARTERS[q]
        crop = messages[-1]["content"][0]["image"]
        lit = crop.reshape(-1, 3)[crop.reshape(-1, 3).amax(-1) > 0]
        at = {c: torch.tensor(rgb, dtype=torch.float32) for c, rgb in zoom._shapes.COLORS.items()}
        hue = lit[0].float() / lit[0].float().max()  # the crop's one object, scaled away from its luma
        assert min(at, key=lambda c: float((at[c] / at[c].max() - hue).abs().max())) == said
        if zoom.QUARTERS[q] != m["quarter"]:
            wrong += 1
            assert said != m["answer"]
        else:
            assert said == m["answer"] and call == plain["solution"][2 * k]
    assert 10 <= wrong <= 30
    with pytest.raises(ValueError, match="wrong_quarter"):
        load_dataset("zoom_vqa", num_samples=2, demos=True, wrong_quarter=0.5)  # the shape question


def test_a_demonstrator_who_confuses_left_and_right_looks_at_the_mirrored_quarter():
    """``wrong_quarter_kind="mirror"``: a sloppy call lands at the quarter with left and right swapped,
    never elsewhere, and its answer is that crop's colour; the other calls are the plain ones."""
    kw = {"num_samples": 40, "demos": True, "sim_kwargs": COLOR_SIM, **COLOR}
    plain = load_dataset("zoom_vqa", **kw)
    demos = load_dataset("zoom_vqa", wrong_quarter=0.5, wrong_quarter_kind="mirror", **kw)
    mirrored = 0
    for k, (call, said, m) in enumerate(zip(demos["solution"][::2], demos["solution"][1::2], demos["meta"][::2])):
        q, _ = called_quarter(call)
        asked = zoom.QUARTERS.index(m["quarter"])
        assert q in (asked, asked ^ 1) and said == m["colors"][q] and m["looked"] == zoom.QUARTERS[q]
        if q != asked:
            mirrored += 1
            assert zoom.QUARTERS[q].split()[0] == m["quarter"].split()[0]  # the same row, the other side
        else:
            assert call == plain["solution"][2 * k]
    assert 10 <= mirrored <= 30
    with pytest.raises(ValueError, match="wrong_quarter_kind"):
        load_dataset("zoom_vqa", wrong_quarter=0.5, wrong_quarter_kind="diagonal", **kw)


def test_a_guessing_demonstrator_keeps_the_protocol_and_teaches_every_word_of_the_vocabulary_alike():
    """``guess_answer``: the calls and conversations are the plain demonstrations', and after some
    calls the answer rows are one per colour, the same conversation each, so SFT can only learn to
    answer every colour alike; the other questions keep their one true answer; at 0 nothing changes."""
    plain = load_dataset("zoom_vqa", num_samples=60, demos=True, sim_kwargs=COLOR_SIM, **COLOR)
    demos = load_dataset("zoom_vqa", num_samples=60, demos=True, sim_kwargs=COLOR_SIM, guess_answer=0.6, **COLOR)
    per_question: dict[int, list[int]] = {}
    for k, m in enumerate(demos["meta"]):
        per_question.setdefault(m["index"], []).append(k)
    assert len(per_question) == 60
    guessed = 0
    for q, (rows, call) in enumerate(zip(per_question.values(), plain["solution"][::2])):
        first, *answers = rows
        assert demos["meta"][first]["turn"] == 0 and demos["solution"][first] == call
        said = [demos["solution"][k] for k in answers]
        if demos["meta"][first]["guessed"]:
            guessed += 1
            assert sorted(said) == sorted(zoom._shapes.COLORS)
            for k in answers:
                same(demos["messages"][k], demos["messages"][answers[0]])
        else:
            assert said == [plain["solution"][2 * q + 1]]
        assert all(demos["meta"][k]["turn"] == 1 for k in answers)
    assert 24 <= guessed <= 48  # 0.6 x 60
    none = load_dataset("zoom_vqa", num_samples=60, demos=True, sim_kwargs=COLOR_SIM, guess_answer=0.0, **COLOR)
    assert none["solution"] == plain["solution"] and none["meta"] == plain["meta"]
    with pytest.raises(ValueError, match="guess_answer"):
        load_dataset("zoom_vqa", num_samples=2, guess_answer=0.5)  # no demonstrations to shape
