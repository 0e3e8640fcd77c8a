"""The success detector (`rewards.success_detector`): its labelled frames are the task's own
success flag (positives are frames whose gripper is within the success radius of the named disc),
a short training run separates success from failure on held-out frames while the same run on
shuffled labels does not (so the accuracy test can fail), and the trained net is an image reward
that passes the contract, round-trips through its folder and scores independently of the batch."""

import pytest
import torch

from mmrl.checks.reward import check_reward
from mmrl.data import load_dataset
from mmrl.registry import REWARDS
from rewards.success_detector import (
    SuccessDetector,
    SuccessNet,
    labelled_frames,
    load_detector,
    save_detector,
    train_success_detector,
)
from simulators.reach import ReachSim

SIM = {"image_size": 32, "num_objects": 3, "max_episode_steps": 20}


def demos(n: int) -> dict:
    return load_dataset("reach_demos", num_episodes=n, seed=0, chunk_size=4, sim_kwargs=SIM, expert_speed=0.4)


@pytest.fixture(scope="module")
def frames(one_torch_thread):
    return labelled_frames(demos(200))


#: a short run (~10 s on one core); a held-out fifth of the frames holds ~20 successes
SHORT = {"steps": 300, "batch_size": 64, "held_out": 0.2, "progress": False}


@pytest.fixture(scope="module")
def trained(frames):
    return train_success_detector(*frames, **SHORT)


def test_labelled_frames_are_the_tasks_success():
    records = demos(32)
    images, prompts, labels = labelled_frames(records)
    starts = (records["step"] == 0).nonzero().flatten()
    m, e = records["image"].shape[0], starts.numel()
    assert images.shape == (m + e, 32, 32, 3) and images.dtype == torch.uint8 and len(prompts) == m + e
    assert labels.dtype == torch.bool and not labels[m:].any()  # start frames: failures
    assert torch.equal(images[m:], records["image"][starts]) and prompts[m:] == [
        records["instruction"][i] for i in starts
    ]
    success = records["episode_success"]
    assert 0 < int(labels.sum()) == int(success.sum()) < e  # one success frame per successful episode
    # each positive is the frame its episode ended on, and that frame's gripper is within the success
    # radius (0.1) of the disc the instruction names; failed episodes ended away from it
    ended = records["episode"][:m][labels[:m]]
    assert torch.equal(ended, success.nonzero().flatten())
    assert torch.equal(images[:m][labels[:m]], records["final_image"][ended])
    sim = ReachSim(num_envs=e, **SIM)
    sim.reset(list(range(e)))
    distance = (records["final_state"][:, :2] - sim.goal_position()).norm(dim=1)
    assert (distance[success] <= 0.1 + 1e-6).all() and (distance[~success] > 0.1).all()


def test_training_separates_success_from_failure(trained):
    _, metrics = trained
    assert metrics["held_out_balanced_accuracy"] >= 0.8, metrics
    assert metrics["held_out_recall"] >= 0.7 and metrics["held_out_precision"] > 0.3, metrics
    assert 0 < metrics["positives"] < metrics["frames"] and metrics["held_out_frames"] > 0


def test_shuffled_labels_do_not_train(frames):
    """The mutation check: the same run on labels shuffled across frames stays near chance."""
    images, prompts, labels = frames
    shuffled = labels[torch.randperm(len(labels), generator=torch.Generator().manual_seed(1))]
    _, metrics = train_success_detector(images, prompts, shuffled, **SHORT)
    assert metrics["held_out_balanced_accuracy"] < 0.7, metrics


def test_fine_tuning_continues_the_given_net(frames):
    images, prompts, labels = frames
    net = SuccessNet(image_size=32, ch=8, dim=16)
    before = net.conv1.weight.clone()
    out, metrics = train_success_detector(images[:400], prompts[:400], labels[:400], steps=3, net=net, progress=False)
    assert out is net and not torch.equal(before, net.conv1.weight) and metrics["frames"] == 400


def test_save_load_round_trip_and_reward(trained, frames, tmp_path):
    net, _ = trained
    images, prompts, _ = frames
    folder = save_detector(net, tmp_path / "detector")
    assert sorted(p.name for p in folder.iterdir()) == ["model.safetensors", "success_detector.json"]
    loaded = SuccessDetector(path=folder)
    direct = SuccessDetector(model=net)
    assert torch.equal(loaded(images[:64], prompts[:64]), direct(images[:64], prompts[:64]))
    assert torch.equal(load_detector(folder).conv1.weight, net.conv1.weight)
    label = SuccessDetector(model=net, output="label")(images[:64], prompts[:64])
    assert set(label.tolist()) <= {0.0, 1.0}
    assert torch.equal(label, (direct.probability(images[:64], prompts[:64]) >= 0.5).float())


def test_the_reward_passes_the_checker(trained):
    assert check_reward(SuccessDetector(model=trained[0]))[-1] == "rejects_bad_input"
    assert check_reward(lambda: REWARDS.build("success_detector", model=SuccessNet(16, ch=8), output="label"))


def test_batch_independence(trained, frames):
    images, prompts, _ = frames
    reward = SuccessDetector(model=trained[0], batch_size=7)  # several internal batches too
    batch = reward(images[:20], prompts[:20])
    alone = torch.cat([reward(images[i : i + 1], prompts[i : i + 1]) for i in range(20)])
    assert torch.allclose(batch, alone, atol=1e-5)
    assert torch.allclose(reward(images[:20].flip(0), prompts[:20][::-1]), batch.flip(0), atol=1e-5)


def test_missing_folder_and_bad_arguments_say_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        SuccessDetector(path=tmp_path / "nothing")
    message = str(info.value)
    assert "\n" not in message and str(tmp_path / "nothing") in message and "rewards.success_detector" in message
    with pytest.raises(ValueError, match="exactly one of"):
        SuccessDetector()
    with pytest.raises(ValueError, match="output"):
        SuccessDetector(model=SuccessNet(), output="logit")
    with pytest.raises(ValueError, match="image_size"):
        SuccessNet(image_size=4)


def test_net_is_small_and_takes_any_size():
    net = SuccessNet(image_size=32).eval()
    conv = sum(p.numel() for n, p in net.named_parameters() if not n.startswith("words."))
    assert 5_000 < conv < 100_000  # the word table (buckets x dim) is the rest
    with torch.no_grad():
        for h, w in ((8, 8), (32, 32), (24, 40), (64, 64)):
            out = net(torch.zeros(2, h, w, 3, dtype=torch.uint8), ["reach the red target"] * 2)
            assert out.shape == (2,) and torch.isfinite(out).all()


def test_the_dyna_hooks_train_and_save(tmp_path):
    """untrained -> fit (more steps on new records) -> save, and path= loads what was saved."""
    reward = SuccessDetector.untrained(32, seed=3)
    assert torch.equal(reward.net.conv1.weight, SuccessDetector.untrained(32, seed=3).net.conv1.weight)
    before = reward.net.conv1.weight.clone()
    metrics = reward.fit(demos(8), steps=2, seed=1)
    assert metrics["steps"] == 2 and not torch.equal(before, reward.net.conv1.weight)
    reward.save(tmp_path / "detector")
    images = torch.randint(0, 256, (4, 32, 32, 3), dtype=torch.uint8)
    prompts = ["reach the red target"] * 4
    assert torch.equal(SuccessDetector(path=tmp_path / "detector")(images, prompts), reward(images, prompts))
