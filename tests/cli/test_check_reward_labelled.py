"""`mmrl check reward NAME labelled=FILE [heldout=NAME]`: after the contract checks, how the reward
tracks success on a labelled sample, in one readable line and one JSON line."""

import json

import torch

from mmrl.cli import main

REWARDS = """
def brightness(images, prompts, **columns):
    return [float(im.float().mean()) / 255.0 for im in images]


def darkness(images, prompts, **columns):
    return [1.0 - float(im.float().mean()) / 255.0 for im in images]
"""


def labelled(tmp_path, n=24):
    success = torch.arange(n) % 3 == 0
    image = torch.zeros(n, 16, 16, 3, dtype=torch.uint8)
    image[success] = 200  # a successful frame is bright: brightness is a faithful reward here
    image[~success] = torch.randint(0, 100, (int((~success).sum()), 1, 1, 1), dtype=torch.uint8)
    path = tmp_path / "frames.pt"
    torch.save({"image": image, "instruction": ["touch the red disc"] * n, "success": success}, path)
    (tmp_path / "rw.py").write_text(REWARDS)
    return path


def last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_a_faithful_reward_and_an_inverted_one_on_labelled_frames(tmp_path, capsys):
    path = labelled(tmp_path)
    fn = f"{tmp_path}/rw.py"
    assert (
        main(["check", "reward", f"{fn}:brightness", "kind=image", f"labelled={path}", f"heldout={fn}:darkness"]) == 0
    )
    out = capsys.readouterr().out
    audit = last_json(out)
    assert audit["n"] == 24 and audit["auc_success"] == 1.0 and audit["success_share"] == 1 / 3
    assert audit["corr_heldout"] < -0.99 and "AUC 1.000" in out and "held-out" in out
    assert main(["check", "reward", f"{fn}:darkness", "kind=image", f"labelled={path}"]) == 0
    assert last_json(capsys.readouterr().out)["auc_success"] == 0.0


def test_a_bad_labelled_file_is_one_line_naming_what_it_lacks(tmp_path, capsys):
    path = tmp_path / "bad.pt"
    torch.save({"image": torch.zeros(2, 8, 8, 3, dtype=torch.uint8)}, path)
    (tmp_path / "rw.py").write_text(REWARDS)
    assert main(["check", "reward", f"{tmp_path}/rw.py:brightness", "kind=image", f"labelled={path}"]) == 2
    err = capsys.readouterr().err
    assert "must hold 'image'" in err and "'success'" in err and err.count("\n") == 1
    assert (
        main(["check", "reward", f"{tmp_path}/rw.py:brightness", "kind=image", f"heldout={tmp_path}/rw.py:darkness"])
        == 2
    )
    assert "add labelled=FILE" in capsys.readouterr().err
