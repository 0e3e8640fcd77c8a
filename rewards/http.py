"""Run any reward behind a local HTTP server, and score through it with `RemoteReward`.

Useful when a reward model needs packages that clash with the trainer's environment, or a device of
its own (as DDPO and Flow-GRPO do with their reward servers). Standard library only on both sides.

Serve (blocks; Ctrl-C stops)::

    python -m rewards.http jpeg_compressibility --port 8000 --kwargs '{"quality": 90}'

or from Python: ``server = RewardServer(reward, port=0).start(); server.url; server.close()``.
Score from the trainer with ``RemoteReward(url="http://127.0.0.1:8000")`` (registered as ``http``).

Protocol (JSON over HTTP):

- ``GET /info`` -> ``{"name": ..., "kind": "image" | "video" | "text"}``
- ``POST /score`` with ``{"prompts": [...], "meta": [...] | null, "samples": S}`` where ``S`` is a
  list of strings (text) or, for images, ``{"encoding": "raw", "shape": [B, H, W, 3], "data":
  base64(uint8 bytes)}`` or ``{"encoding": "png", "data": [base64(PNG), ...]}`` (both lossless);
  for videos ``[B, F, H, W, 3]``, the B * F frames in that order as an image batch plus
  ``"frames": F``.
  -> ``{"scores": [...]}``; on failure HTTP 400 (bad input, the reward raised ``ValueError``) or
  500 (anything else) with ``{"error": message, "type": exception class name}``.

The client gives each attempt ``timeout`` seconds (default 60) for the connection and the whole
answer (a server trickling its answer byte by byte is cut off too, within one more read); it retries
timeouts, failed connections and 5xx answers (``retries``, default 3, with exponential ``backoff``
from 0.5 s; never a 4xx), and checks every answer: JSON, a ``"scores"`` list of one finite number
per sample. A server that never answers fails after ``(retries + 1) * timeout`` plus the backoff,
with the URL in the message.

Scores travel as JSON floats, which round-trip float32 exactly. Requests are accepted concurrently
(``ThreadingHTTPServer``) and scored one at a time (a lock: reward models need not be thread-safe).
"""

from __future__ import annotations

import argparse
import base64
import http.client
import io
import json
import math
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
import torch

from mmrl.reward import Reward, RewardError, check_kind

#: this module as `python -m` runs it: rewards.http in the repository, mmrl_rewards.http in a wheel
MODULE = f"{__package__ or 'rewards'}.http"


class RemoteRewardError(RewardError):
    """The reward server could not be reached or failed; the message names the URL."""


# ----------------------------------------------------------------------------- wire format (pure)
def encode_images(images: torch.Tensor, encoding: str = "raw") -> dict:
    """uint8 ``[B, H, W, 3]`` -> JSON-able dict (``raw`` bytes or per-image ``png``), lossless."""
    arr = np.ascontiguousarray(images.cpu().numpy())
    if encoding == "raw":
        return {"encoding": "raw", "shape": list(arr.shape), "data": base64.b64encode(arr.tobytes()).decode()}
    if encoding == "png":
        from PIL import Image

        pngs = []
        for a in arr:
            buf = io.BytesIO()
            Image.fromarray(a).save(buf, format="PNG")
            pngs.append(base64.b64encode(buf.getvalue()).decode())
        return {"encoding": "png", "data": pngs}
    raise ValueError(f"image encoding must be 'raw' or 'png', got {encoding!r}")


def decode_images(payload: dict) -> torch.Tensor:
    """Inverse of `encode_images`; raises ``ValueError`` on a malformed payload."""
    try:
        if payload["encoding"] == "raw":
            shape = tuple(int(s) for s in payload["shape"])
            arr = np.frombuffer(base64.b64decode(payload["data"]), dtype=np.uint8).reshape(shape)
        elif payload["encoding"] == "png":
            from PIL import Image

            arrs = [np.asarray(Image.open(io.BytesIO(base64.b64decode(d))).convert("RGB")) for d in payload["data"]]
            arr = np.stack(arrs) if arrs else np.zeros((0, 1, 1, 3), np.uint8)
        else:
            raise ValueError(f"unknown image encoding {payload['encoding']!r}")
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"malformed images payload: {exc}") from exc
    return torch.from_numpy(arr.copy())


def encode_videos(videos: torch.Tensor, encoding: str = "raw") -> dict:
    """uint8 ``[B, F, H, W, 3]`` -> `encode_images` of its B * F frames plus ``"frames": F``."""
    b, f, h, w, c = videos.shape
    return {**encode_images(videos.reshape(b * f, h, w, c), encoding), "frames": f}


def decode_videos(payload: dict) -> torch.Tensor:
    """Inverse of `encode_videos`; raises ``ValueError`` on a malformed payload."""
    frames = payload.get("frames") if isinstance(payload, dict) else None
    if isinstance(frames, bool) or not isinstance(frames, int) or frames < 1:
        raise ValueError(f"malformed videos payload: 'frames' must be an integer >= 1, got {frames!r}")
    images = decode_images(payload)
    if images.dim() != 4 or images.shape[0] % frames:
        raise ValueError(f"malformed videos payload: {tuple(images.shape)} frames do not split into videos of {frames}")
    return images.reshape(-1, frames, *images.shape[1:])


# ----------------------------------------------------------------------------- server
class RewardServer(ThreadingHTTPServer):
    """Serves one reward on ``host:port`` (``port=0``: a free port); ``url`` once bound."""

    daemon_threads = True

    def __init__(self, reward: Reward, host: str = "127.0.0.1", port: int = 0):
        self.reward, self.lock, self.thread = reward, threading.Lock(), None
        super().__init__((host, port), _Handler)
        self.url = f"http://{self.server_address[0]}:{self.server_address[1]}"

    def start(self) -> RewardServer:
        """Serve in a background daemon thread; returns self."""
        self.thread = threading.Thread(target=self.serve_forever, args=(0.05,), name="reward-server", daemon=True)
        self.thread.start()
        return self

    def close(self) -> None:
        self.shutdown()
        self.server_close()

    def handle_score(self, request: dict) -> list[float]:
        if not isinstance(request, dict) or "prompts" not in request or "samples" not in request:
            raise ValueError("request must be a JSON object with 'samples', 'prompts' and optionally 'meta'")
        samples = request["samples"]
        kind = self.reward.kind
        if kind in ("image", "video"):
            if not isinstance(samples, dict):
                raise ValueError(
                    f"{'an' if kind == 'image' else 'a'} {kind} reward needs 'samples' as an encoded {kind} batch"
                )
            samples = decode_images(samples) if kind == "image" else decode_videos(samples)
        with self.lock:
            return self.reward(samples, request["prompts"], request.get("meta")).tolist()


class _Handler(BaseHTTPRequestHandler):
    server: RewardServer

    def reply(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # http.server naming
        if self.path.rstrip("/") == "/info":
            self.reply(200, {"name": self.server.reward.name, "kind": self.server.reward.kind})
        else:
            self.reply(404, {"error": f"no such path {self.path!r}: use GET /info or POST /score", "type": "NotFound"})

    def do_POST(self) -> None:
        if self.path.rstrip("/") != "/score":
            self.reply(404, {"error": f"no such path {self.path!r}: use POST /score", "type": "NotFound"})
            return
        try:
            request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"null")
            self.reply(200, {"scores": self.server.handle_score(request)})
        except ValueError as exc:  # bad input (json.JSONDecodeError included)
            self.reply(400, {"error": str(exc), "type": type(exc).__name__})
        except Exception as exc:  # report every failure to the client
            self.reply(500, {"error": f"{type(exc).__name__}: {exc}", "type": type(exc).__name__})

    def log_message(self, format: str, *args: Any) -> None:  # quiet: one line per request is noise
        pass


# ----------------------------------------------------------------------------- client
def parse_scores(body: bytes, n: int, url: str) -> list[float]:
    """The ``n`` scores in a ``POST /score`` answer ``body`` from the server at ``url``.

    Raises `RemoteRewardError` naming ``url`` unless ``body`` is a JSON object whose ``"scores"`` is a
    list of exactly ``n`` finite numbers (booleans are not numbers).
    """
    answer = _parse_json(body, url, "POST /score")
    scores = answer.get("scores")
    if not isinstance(scores, list):
        raise RemoteRewardError(
            f"reward server at {url} answered POST /score without a 'scores' list (got {_preview(answer)}); "
            f'it must answer {{"scores": [one number per sample]}}: is {url} a {MODULE} server?'
        )
    if len(scores) != n:
        raise RemoteRewardError(
            f"reward server at {url} returned {len(scores)} scores for {n} samples; the reward it serves must "
            "return one score per sample"
        )
    for i, v in enumerate(scores):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise RemoteRewardError(
                f"reward server at {url} returned score {i} = {_preview(v)}, not a number; the reward it serves "
                "must return numbers"
            )
        if not math.isfinite(v):
            raise RemoteRewardError(
                f"reward server at {url} returned a non-finite score {v} at index {i}; the reward it serves must "
                "return finite scores"
            )
    return [float(v) for v in scores]


def _parse_json(body: bytes, url: str, request: str) -> dict:
    try:
        answer = json.loads(body)
    except ValueError as exc:  # JSONDecodeError and bad UTF-8 both
        raise RemoteRewardError(
            f"reward server at {url} answered {request} with invalid JSON ({exc}): {_preview(body)}; is {url} a "
            f"{MODULE} server (`python -m {MODULE} REWARD_NAME`)?"
        ) from None
    if not isinstance(answer, dict):
        raise RemoteRewardError(
            f"reward server at {url} answered {request} with JSON {type(answer).__name__} {_preview(answer)}, not an "
            f"object; is {url} a {MODULE} server (`python -m {MODULE} REWARD_NAME`)?"
        )
    return answer


def _preview(x: Any, limit: int = 80) -> str:
    text = repr(x)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class RemoteReward(Reward):
    """A reward scored by a `RewardServer` at ``url`` (same contract as a local reward).

    Each attempt gets ``timeout`` seconds for the connection and the whole answer. A request
    that times out, cannot connect, or gets a 5xx answer is sent again up to ``retries`` more times,
    ``backoff``, ``2 * backoff``, ``4 * backoff``, ... seconds apart; a 4xx answer is not retried (400,
    the reward rejected its input, raises ``ValueError``). Every answer is validated (JSON, one finite
    score per sample); every failure raises one line naming the URL, what went wrong and the fix.
    """

    name = "http"

    def __init__(
        self,
        *,
        url: str = "http://127.0.0.1:8000",
        kind: str = "image",
        name: str | None = None,
        encoding: str = "raw",
        timeout: float = 60.0,
        retries: int = 3,
        backoff: float = 0.5,
    ):
        check_kind(kind)
        if not (isinstance(timeout, (int, float)) and timeout > 0 and math.isfinite(timeout)):
            raise ValueError(f"RemoteReward: timeout must be a positive number of seconds, got {timeout!r}")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"RemoteReward: retries must be an integer >= 0 (0: no retry), got {retries!r}")
        if not (isinstance(backoff, (int, float)) and backoff >= 0 and math.isfinite(backoff)):
            raise ValueError(f"RemoteReward: backoff must be a number of seconds >= 0, got {backoff!r}")
        self.url, self.kind, self.encoding = url.rstrip("/"), kind, encoding
        self.timeout, self.retries, self.backoff = float(timeout), retries, float(backoff)
        self.name = name or f"http({self.url})"

    def info(self) -> dict:
        """The server's ``{"name", "kind"}``."""
        return _parse_json(self._request("GET", "/info"), self.url, "GET /info")

    def preflight(self) -> None:
        """The server answers ``GET /info`` and serves this ``kind`` (checked before a run starts)."""
        kind = self.info().get("kind")
        if kind is not None and kind != self.kind:
            raise RemoteRewardError(
                f"reward server at {self.url} serves a {kind!r} reward but this client was "
                f"configured with kind={self.kind!r}: set reward.kwargs.kind={kind}"
            )

    def score(self, samples, prompts, meta) -> torch.Tensor:
        encode = {"image": encode_images, "video": encode_videos}.get(self.kind)
        body = {
            "samples": encode(samples, self.encoding) if encode is not None else list(samples),
            "prompts": list(prompts),
            "meta": meta,
        }
        scores = parse_scores(self._request("POST", "/score", body), len(body["prompts"]), self.url)
        return torch.tensor(scores, dtype=torch.float32)

    def _request(self, method: str, path: str, body: dict | None = None) -> bytes:
        """The body of a 2xx answer to ``method path``, after up to ``retries`` retries."""
        try:
            data = None if body is None else json.dumps(body).encode()
        except TypeError as exc:
            raise ValueError(f"cannot send to the reward server at {self.url}: {exc} (meta must be JSON-able)") from exc
        attempts = self.retries + 1
        for attempt in range(attempts):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            req = urllib.request.Request(
                self.url + path, data=data, method=method, headers={"Content-Type": "application/json"}
            )
            try:
                deadline = time.monotonic() + self.timeout
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    return read_within(resp, deadline)
            except urllib.error.HTTPError as exc:
                failure = self._http_failure(exc, attempts)
                if exc.code < 500:  # the request is wrong: sending it again cannot help
                    raise failure from None
            except urllib.error.URLError as exc:  # no connection (refused, timed out, no such host, ...)
                failure = self._unreachable(exc.reason, attempts)
            except http.client.RemoteDisconnected as exc:  # closed the connection without an answer
                failure = self._unreachable(exc, attempts)
            except http.client.HTTPException as exc:  # answered, but not with an HTTP response
                raise RemoteRewardError(
                    f"reward server at {self.url} answered {method} {path} with a broken HTTP response "
                    f"({type(exc).__name__}: {_preview(str(exc))}); is {self.url} a {MODULE} server "
                    f"(`python -m {MODULE} REWARD_NAME`)?"
                ) from None
            except OSError as exc:  # a read timed out, the connection was reset, ...
                failure = self._unreachable(exc, attempts)
        raise failure

    def _http_failure(self, exc: urllib.error.HTTPError, attempts: int) -> Exception:
        try:
            err = json.loads(exc.read()).get("error")
        except (ValueError, AttributeError, OSError):
            err = exc.reason
        if exc.code == 400:
            return ValueError(
                f"reward server at {self.url} answered 400: {err} (the reward rejected the samples "
                "or prompts sent; fix them)"
            )
        if exc.code < 500:
            return RemoteRewardError(
                f"reward server at {self.url} answered {exc.code}: {err}; is {self.url} a {MODULE} server "
                "(GET /info, POST /score)?"
            )
        return RemoteRewardError(
            f"reward server at {self.url} answered {exc.code}: {err} ({_tries(attempts)}); the reward failed on "
            "the server: fix it there, or raise RemoteReward(retries=...) if the failure is transient"
        )

    def _unreachable(self, reason: Any, attempts: int) -> RemoteRewardError:
        if isinstance(reason, TimeoutError):
            return RemoteRewardError(
                f"reward server at {self.url} timed out: no complete answer within timeout={self.timeout:g} s "
                f"({_tries(attempts)}); check that it is alive (GET {self.url}/info), or raise "
                "RemoteReward(timeout=...) if scoring a batch takes longer"
            )
        return RemoteRewardError(
            f"reward server at {self.url} is unreachable ({reason}; {_tries(attempts)}); start one with "
            f"`python -m {MODULE} REWARD_NAME --port PORT`"
        )


def read_within(resp, deadline: float, block: int = 1 << 16) -> bytes:
    """The body of ``resp``, read as it arrives; `TimeoutError` once ``deadline`` (monotonic) has
    passed with the body incomplete: a server that trickles its answer cannot stretch one attempt
    past its timeout by more than one read (each read waits at most the socket's timeout)."""
    chunks = []
    while True:
        if time.monotonic() > deadline:
            raise TimeoutError("the answer did not arrive whole within the timeout")
        chunk = resp.read1(block)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _tries(attempts: int) -> str:
    return "1 attempt" if attempts == 1 else f"{attempts} attempts"


def main(argv: list[str] | None = None) -> None:
    """``python -m rewards.http NAME [--host H] [--port P] [--kwargs JSON]``: serve a registered reward."""
    from mmrl.registry import REWARDS

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("name", help=f"a registered reward: {', '.join(REWARDS.names())}")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--kwargs", default="{}", help="constructor keyword arguments as a JSON object")
    args = parser.parse_args(argv)
    if args.name not in REWARDS:
        parser.error(f"no registered reward '{args.name}': one of {', '.join(REWARDS.names())}")
    try:
        kwargs = json.loads(args.kwargs)
    except json.JSONDecodeError as exc:
        parser.error(
            f'--kwargs {args.kwargs!r} is not JSON ({exc.msg} at char {exc.pos}): e.g. \'{{"device": "cpu"}}\''
        )
    if not isinstance(kwargs, dict):
        parser.error(f"--kwargs must be a JSON object of constructor keyword arguments, got {args.kwargs!r}")
    try:
        reward = REWARDS.build(args.name, **kwargs)
    except TypeError as exc:  # a keyword the reward's constructor does not take
        parser.error(f"reward '{args.name}' does not take --kwargs {kwargs}: {exc}")
    try:
        server = RewardServer(reward, args.host, args.port)
    except OSError as exc:  # the port in use, a host not of this machine
        parser.error(f"cannot serve at {args.host}:{args.port}: {exc.strerror or exc}; choose another --port / --host")
    print(f"serving reward '{args.name}' at {server.url}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


__all__ = [
    "RemoteReward",
    "RewardServer",
    "RemoteRewardError",
    "encode_images",
    "decode_images",
    "encode_videos",
    "decode_videos",
    "parse_scores",
]

if __name__ == "__main__":
    main()
