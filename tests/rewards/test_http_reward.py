"""A reward behind the local HTTP server scores exactly as in-process; errors name the URL."""

import json
import socket
import urllib.error
import urllib.request

import pytest
import torch

from rewards import Reward, check_reward
from rewards.http import RemoteReward, RemoteRewardError, RewardServer, decode_images, encode_images
from rewards.jpeg import JpegCompressibility
from rewards.ocr import OCRScore

IMAGES = torch.randint(0, 256, (3, 24, 40, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
PROMPTS = ['a sign "a"', 'a sign "b"', 'a sign "c"']


class Boom(Reward):
    name = "boom"

    def score(self, images, prompts, meta):
        raise RuntimeError("model exploded")


class Length(Reward):
    name, kind = "length", "text"

    def score(self, completions, prompts, meta):
        return torch.tensor([len(c) + 0.5 * len(m) for c, m in zip(completions, meta)])


@pytest.fixture
def serve():
    servers = []

    def start(reward):
        servers.append(RewardServer(reward).start())
        return servers[-1]

    yield start
    for s in servers:
        s.close()


@pytest.mark.parametrize("encoding", ["raw", "png"])
def test_images_roundtrip_losslessly(encoding):
    payload = json.loads(json.dumps(encode_images(IMAGES, encoding)))
    assert torch.equal(decode_images(payload), IMAGES)


@pytest.mark.parametrize("encoding", ["raw", "png"])
def test_remote_scores_equal_local_scores_exactly(serve, encoding):
    local = JpegCompressibility(quality=90)
    server = serve(local)
    remote = RemoteReward(url=server.url, encoding=encoding)
    assert torch.equal(remote(IMAGES, PROMPTS), local(IMAGES, PROMPTS))
    assert remote.info() == {"name": "jpeg_compressibility", "kind": "image"}
    assert "batch_invariance" in check_reward(remote)


def test_remote_text_reward_passes_the_checker(serve):
    server = serve(Length())
    remote = RemoteReward(url=server.url, kind="text", name="length")
    assert remote(["ab", "abcd"], ["p", "q"], [{}, {"x": 1}]).tolist() == [2.0, 4.5]
    assert "deterministic" in check_reward(remote, kind="text")


def test_server_errors_reach_the_client_with_the_url(serve):
    bad_input = serve(OCRScore(engine=lambda image: ""))  # raises ValueError without a quoted target
    with pytest.raises(ValueError, match=rf"{bad_input.url} answered 400: .*target text"):
        RemoteReward(url=bad_input.url)(IMAGES[:1], ["no quoted text"])
    broken = serve(Boom())
    with pytest.raises(RemoteRewardError, match=rf"{broken.url} answered 500: RuntimeError: model exploded"):
        RemoteReward(url=broken.url)(IMAGES[:1], ["x"])
    req = urllib.request.Request(broken.url + "/score", data=b"{not json", method="POST")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=10)
    assert err.value.code == 400


def test_unreachable_server_is_a_clear_error():
    with socket.socket() as s:  # a port that was free a moment ago and has nobody listening now
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with pytest.raises(RemoteRewardError, match=rf"{url} is unreachable.*python -m rewards.http"):
        RemoteReward(url=url, timeout=5)(IMAGES[:1], ["x"])
