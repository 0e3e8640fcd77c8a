"""VLM judge: answer parsing (hand-written cases), batched scoring with a deterministic callable backend,
the contract checker, and the OpenAI-compatible HTTP backend against a local stub server."""

import base64
import io
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import torch
from PIL import Image

from rewards import check_reward
from rewards.vlm_judge import SCORE_TEMPLATE, YES_NO_TEMPLATE, VLMJudge, VLMJudgeError, parse_score, parse_yes_no

IMAGES = torch.randint(0, 256, (3, 16, 24, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
IMAGES[0] = 250  # bright: the stub backend says yes
IMAGES[1] = 5  # dark: no
PROMPTS = ["pick up the red cube", "open the drawer", "push the block"]


# ----------------------------------------------------------------------------- parsing
@pytest.mark.parametrize(
    "text, want",
    [
        ("Yes", 1.0),
        ("yes.", 1.0),
        ("YES!", 1.0),
        ("**Yes**", 1.0),
        ("Answer: yes", 1.0),
        ("Final answer: Yes.", 1.0),
        ("Yes, the cube is lifted.", 1.0),
        ("  yes\n", 1.0),
        ("`yes`", 1.0),
        ("No", 0.0),
        ("no.", 0.0),
        ("**No**", 0.0),
        ("Answer: No, the drawer is closed", 0.0),
        ("NO!!", 0.0),
        ("The drawer is still closed, so no.", 0.0),
        ("I think yes.", 1.0),
        ("True", 1.0),
        ("false", 0.0),
        ("", None),
        ("Not sure", None),
        ("N/A", None),
        ("maybe yes, maybe no", None),
        ("The image is blurry", None),
    ],
)
def test_parse_yes_no(text, want):
    assert parse_yes_no(text) == want


@pytest.mark.parametrize(
    "text, want",
    [
        ("7", 7.0),
        ("7.5", 7.5),
        ("7/10", 7.0),
        ("Score: 7.5", 7.5),
        ("score: 8/10", 8.0),
        ("**8**", 8.0),
        ("8 out of 10", 8.0),
        ("4/5", 8.0),
        ("Rating: 4/5", 8.0),
        ("12", 10.0),
        ("-3", 0.0),
        ("11/10", 10.0),
        ("seven", 7.0),
        ("Answer: 6", 6.0),
        ("7. The cube was grasped on the 2nd try", 7.0),
        ("On a scale from 0 to 10, I would give it a 3.", 3.0),
        ("I'd rate it 9 out of 10.", 9.0),
        ("The score is 5", 5.0),
        ("no idea", None),
        ("", None),
    ],
)
def test_parse_score(text, want):
    assert parse_score(text, 10.0) == (pytest.approx(want) if want is not None else None)


def test_parse_score_other_max():
    assert parse_score("4", 5.0) == 4.0 and parse_score("8/10", 5.0) == pytest.approx(4.0)
    assert parse_score("9", 5.0) == 5.0


# ----------------------------------------------------------------------------- callable backend
class Stub:
    """Deterministic backend: yes/no from the mean brightness, every call recorded."""

    def __init__(self, answers=None):
        self.calls, self.answers = [], answers

    def __call__(self, images, questions):
        self.calls.append((len(images), list(questions)))
        assert all(isinstance(i, Image.Image) for i in images)
        if self.answers is not None:
            return [self.answers[q] for q in questions]
        return ["**Yes**" if np.asarray(i).mean() > 127 else "No." for i in images]


def test_batched_call_with_a_callable_backend():
    stub = Stub()
    judge = VLMJudge(generate_fn=stub)
    out = judge(IMAGES, PROMPTS)
    mean = IMAGES[2].float().mean().item()
    assert out.tolist() == [1.0, 0.0, 1.0 if mean > 127 else 0.0]
    assert len(stub.calls) == 1 and stub.calls[0][0] == 3
    assert stub.calls[0][1] == [YES_NO_TEMPLATE.format(instruction=p) for p in PROMPTS]
    assert stub.calls[0][1][0] == (
        "Task: pick up the red cube. Has the task been completed in this image? Answer yes or no."
    )
    assert judge.last_answers[:2] == ["**Yes**", "No."] and judge.num_unparsed == 0
    # batch_size splits the backend calls, not the result
    chunked = Stub()
    assert VLMJudge(generate_fn=chunked, batch_size=2)(IMAGES, PROMPTS).tolist() == out.tolist()
    assert [n for n, _ in chunked.calls] == [2, 1]


def test_score_mode_unparsed_fallback_and_counter():
    questions = [SCORE_TEMPLATE.format(instruction=p) for p in PROMPTS]
    stub = Stub(dict(zip(questions, ["7/10", "Score: 12", "I cannot see the robot"])))
    judge = VLMJudge(generate_fn=stub, mode="score", fallback=0.25)
    assert torch.allclose(judge(IMAGES, PROMPTS), torch.tensor([0.7, 1.0, 0.25]))
    assert judge.num_unparsed == 1
    judge(IMAGES, PROMPTS)
    assert judge.num_unparsed == 2
    custom = VLMJudge(
        generate_fn=lambda ims, qs: ["3"] * len(ims),
        mode="score",
        max_score=5,
        template="Out of 5, how done is: {instruction}?",
    )
    assert torch.allclose(custom(IMAGES, PROMPTS), torch.full((3,), 0.6))


def test_bad_configuration_and_bad_backend_output():
    with pytest.raises(ValueError, match="exactly one backend"):
        VLMJudge()
    with pytest.raises(ValueError, match="exactly one backend"):
        VLMJudge(generate_fn=Stub(), base_url="http://127.0.0.1:1/v1", model="m")
    with pytest.raises(ValueError, match="instruction"):
        VLMJudge(generate_fn=Stub(), template="Is it done?")
    with pytest.raises(ValueError, match="mode"):
        VLMJudge(generate_fn=Stub(), mode="logprob")
    with pytest.raises(VLMJudgeError, match="3 strings"):
        VLMJudge(generate_fn=lambda ims, qs: ["yes"])(IMAGES, PROMPTS)


def test_vlm_judge_passes_the_checker():
    from mmrl.registry import REWARDS

    passed = check_reward(lambda: REWARDS.build("vlm_judge", generate_fn=Stub()))
    assert passed[-1] == "rejects_bad_input" and "batch_invariance" in passed


# ----------------------------------------------------------------------------- HTTP backend
class ChatHandler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append((self.path, dict(self.headers), body))
        if self.server.fail:
            self.send_response(500)
            self.end_headers()
            self.wfile.write(b'{"error": "model not loaded"}')
            return
        question = body["messages"][0]["content"][1]["text"]
        content = "Yes, it is." if "cube" in question else "**No**"
        data = json.dumps(
            {
                "id": "x",
                "object": "chat.completion",
                "model": body["model"],
                "choices": [
                    {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}
                ],
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def chat_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), ChatHandler)
    server.requests, server.fail = [], False
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_http_backend_sends_the_image_and_question(chat_server):
    url = f"http://127.0.0.1:{chat_server.server_address[1]}/v1"
    judge = VLMJudge(base_url=url, model="smolvlm", api_key="k123", timeout=10)
    out = judge(IMAGES, PROMPTS)
    assert out.tolist() == [1.0, 0.0, 0.0]
    assert len(chat_server.requests) == 3
    by_text = {}
    for path, headers, body in chat_server.requests:
        assert path == "/v1/chat/completions" and headers["Authorization"] == "Bearer k123"
        assert body["model"] == "smolvlm" and body["temperature"] == 0.0
        (message,) = body["messages"]
        assert message["role"] == "user"
        image_part, text_part = message["content"]
        assert image_part["type"] == "image_url" and text_part["type"] == "text"
        data_url = image_part["image_url"]["url"]
        assert data_url.startswith("data:image/png;base64,")
        png = Image.open(io.BytesIO(base64.b64decode(data_url.split(",", 1)[1])))
        by_text[text_part["text"]] = np.asarray(png)
    for image, prompt in zip(IMAGES, PROMPTS):  # each question travelled with its own image, losslessly
        assert np.array_equal(by_text[YES_NO_TEMPLATE.format(instruction=prompt)], image.numpy())


def test_http_backend_errors_name_the_url(chat_server):
    url = f"http://127.0.0.1:{chat_server.server_address[1]}/v1"
    chat_server.fail = True
    with pytest.raises(VLMJudgeError, match=r"127\.0\.0\.1.*/v1/chat/completions answered HTTP 500.*not loaded"):
        VLMJudge(base_url=url, model="m", timeout=10)(IMAGES[:1], PROMPTS[:1])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    with pytest.raises(VLMJudgeError, match=rf"could not reach .*127\.0\.0\.1:{port}/v1/chat/completions"):
        VLMJudge(base_url=f"http://127.0.0.1:{port}/v1", model="m", timeout=2)(IMAGES[:1], PROMPTS[:1])
