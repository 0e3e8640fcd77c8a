"""A reward behind the local HTTP server scores exactly as in-process; errors name the URL.

The client's failure modes run against real local HTTP servers that misbehave on purpose (never
answer, answer garbage, answer the wrong shape, fail with 5xx or 4xx) and count the requests.
"""

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from rewards import Reward, check_reward
from rewards.http import RemoteReward, RemoteRewardError, decode_images, encode_images
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
    with pytest.raises(
        RemoteRewardError,
        match=rf"{broken.url} answered 500: RuntimeError: model exploded "
        r"\(2 attempts\); .*fix it there",
    ):
        RemoteReward(url=broken.url, retries=1, backoff=0.001)(IMAGES[:1], ["x"])
    req = urllib.request.Request(broken.url + "/score", data=b"{not json", method="POST")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=10)
    assert err.value.code == 400


def test_unreachable_server_is_a_clear_error():
    with socket.socket() as s:  # a port that was free a moment ago and has nobody listening now
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with pytest.raises(RemoteRewardError, match=rf"{url} is unreachable \(.*; 2 attempts\).*python -m rewards.http"):
        RemoteReward(url=url, timeout=5, retries=1, backoff=0.001)(IMAGES[:1], ["x"])


# ---------------------------------------------------------------------------- misbehaving servers
class _Scripted(BaseHTTPRequestHandler):
    server: "ThreadingHTTPServer"

    def do_GET(self):  # http.server naming
        srv = self.server
        with srv.lock:
            hit = srv.hits
            srv.hits += 1
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        srv.answer(self, hit)

    do_POST = do_GET

    def log_message(self, format, *args):
        pass


def reply(handler, status: int, body) -> None:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    handler.send_response(status)
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


@pytest.fixture
def scripted():
    """``scripted(answer)``: a local HTTP server calling ``answer(handler, hit)`` for its ``hit``-th
    request (from 0); the server has ``url``, ``hits`` and ``release`` (set at teardown)."""
    servers = []

    def start(answer):
        srv = ThreadingHTTPServer(("127.0.0.1", 0), _Scripted)
        srv.daemon_threads = True
        srv.answer, srv.hits, srv.lock, srv.release = answer, 0, threading.Lock(), threading.Event()
        srv.url = f"http://127.0.0.1:{srv.server_address[1]}"
        threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True).start()
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        srv.release.set()
        srv.shutdown()
        srv.server_close()


def text_reward(url: str, **kwargs) -> RemoteReward:
    return RemoteReward(url=url, kind="text", **{"backoff": 0.001, **kwargs})


def test_a_server_that_never_answers_times_out_with_the_url(scripted):
    srv = scripted(lambda h, hit: h.server.release.wait(10))
    start = time.monotonic()
    with pytest.raises(
        RemoteRewardError,
        match=rf"{srv.url} timed out: no complete answer within timeout=0.3 s "
        r"\(2 attempts\).*RemoteReward\(timeout=...\)",
    ):
        text_reward(srv.url, timeout=0.3, retries=1)(["a", "b"], ["p", "q"])
    assert 0.6 <= time.monotonic() - start < 3.0  # two attempts of 0.3 s, not the old 600 s each
    assert srv.hits == 2


def trickle(handler, hit):
    """Headers at once, then one byte of a 100-byte body every 0.1 s (10 s in all)."""
    handler.send_response(200)
    handler.send_header("Content-Length", "100")
    handler.end_headers()
    for _ in range(100):
        if handler.server.release.wait(0.1):
            return
        handler.wfile.write(b" ")
        handler.wfile.flush()


def test_a_server_that_trickles_its_answer_is_cut_off_at_the_timeout(scripted):
    """Every read returns within the socket timeout, so only a deadline on the whole answer ends it."""
    srv = scripted(trickle)
    start = time.monotonic()
    with pytest.raises(
        RemoteRewardError,
        match=rf"{srv.url} timed out: no complete answer within timeout=0.5 s "
        r"\(1 attempt\)",
    ):
        text_reward(srv.url, timeout=0.5, retries=0)(["a", "b"], ["p", "q"])
    assert 0.5 <= time.monotonic() - start < 2.0  # not the 10 s the server takes


@pytest.mark.parametrize(
    "body, match",
    [
        (
            b"\x00\xffnot json",
            r"answered POST /score with invalid JSON \(.*\): b'\\x00\\xffnot json'; is .* a rewards.http server",
        ),
        (b"[1.0, 2.0]", r"answered POST /score with JSON list \[1.0, 2.0\], not an object"),
        (b'{"score": [1.0, 2.0]}', r"answered POST /score without a 'scores' list \(got \{'score': "),
        (b'{"scores": "1 2"}', r"answered POST /score without a 'scores' list"),
        (b'{"scores": [1.0]}', r"returned 1 scores for 2 samples; .*one score per sample"),
        (b'{"scores": [1.0, 2.0, 3.0]}', r"returned 3 scores for 2 samples"),
        (b'{"scores": [1.0, "2"]}', r"returned score 1 = '2', not a number"),
        (b'{"scores": [true, 1.0]}', r"returned score 0 = True, not a number"),
        (b'{"scores": [1.0, NaN]}', r"returned a non-finite score nan at index 1; .*finite scores"),
        (b'{"scores": [-Infinity, 1.0]}', r"returned a non-finite score -inf at index 0"),
        (b'{"scores": [1.0, 1e999]}', r"returned a non-finite score inf at index 1"),
    ],
)
def test_a_wrong_answer_is_one_clear_error_naming_the_url(scripted, body, match):
    srv = scripted(lambda h, hit: reply(h, 200, body))
    with pytest.raises(RemoteRewardError, match=rf"^reward server at {srv.url} {match}"):
        text_reward(srv.url)(["a", "b"], ["p", "q"])
    assert srv.hits == 1  # a wrong answer is not retried


def test_garbage_bytes_instead_of_http_is_a_clear_error(scripted):
    def garbage(h, hit):
        h.wfile.write(b"\x17garbage, not HTTP\r\n\r\n")
        h.close_connection = True

    srv = scripted(garbage)
    with pytest.raises(
        RemoteRewardError,
        match=rf"{srv.url} answered POST /score with a broken HTTP response "
        r"\(BadStatusLine: .*garbage.*is .* a rewards.http server",
    ):
        text_reward(srv.url)(["a"], ["p"])
    assert srv.hits == 1


def test_5xx_answers_are_retried_with_backoff(scripted):
    srv = scripted(
        lambda h, hit: reply(h, 503, {"error": "warming up"}) if hit < 2 else reply(h, 200, {"scores": [0.5, 1.5]})
    )
    start = time.monotonic()
    assert text_reward(srv.url, retries=3, backoff=0.05)(["a", "b"], ["p", "q"]).tolist() == [0.5, 1.5]
    assert srv.hits == 3
    assert time.monotonic() - start >= 0.05 + 0.1  # backoff, then twice the backoff

    always = scripted(lambda h, hit: reply(h, 503, {"error": "warming up"}))
    with pytest.raises(
        RemoteRewardError,
        match=rf"{always.url} answered 503: warming up \(3 attempts\); "
        r".*RemoteReward\(retries=...\)",
    ):
        text_reward(always.url, retries=2)(["a"], ["p"])
    assert always.hits == 3


@pytest.mark.parametrize("status, error", [(400, ValueError), (404, RemoteRewardError)])
def test_4xx_answers_are_not_retried(scripted, status, error):
    srv = scripted(lambda h, hit: reply(h, status, {"error": "no such thing"}))
    with pytest.raises(error, match=rf"{srv.url} answered {status}: no such thing"):
        text_reward(srv.url, retries=3)(["a"], ["p"])
    assert srv.hits == 1


def test_info_answer_is_validated(scripted):
    srv = scripted(lambda h, hit: reply(h, 200, b"<html>hello</html>"))
    with pytest.raises(RemoteRewardError, match=rf"{srv.url} answered GET /info with invalid JSON"):
        text_reward(srv.url).info()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"timeout": 0}, "timeout must be a positive"),
        ({"timeout": float("inf")}, "timeout must be a positive"),
        ({"retries": -1}, "retries must be an integer >= 0"),
        ({"retries": 1.5}, "retries must be an integer >= 0"),
        ({"backoff": -0.1}, "backoff must be a number of seconds >= 0"),
    ],
)
def test_bad_client_settings_fail_at_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RemoteReward(url="http://127.0.0.1:1", **kwargs)


def test_defaults_bound_the_wait():
    remote = RemoteReward()
    assert remote.timeout == 60.0 and remote.retries == 3 and remote.backoff == 0.5


def test_preflight_checks_the_server_answers_and_serves_the_configured_kind(serve):
    server = serve(Length())
    RemoteReward(url=server.url, kind="text").preflight()
    with pytest.raises(RemoteRewardError, match=r"serves a 'text' reward .* kind='image': set reward.kwargs.kind=text"):
        RemoteReward(url=server.url, kind="image").preflight()
    with pytest.raises(RemoteRewardError, match="unreachable"):
        RemoteReward(url="http://127.0.0.1:9", retries=0).preflight()
