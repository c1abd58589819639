"""Run the real aiohttp app on a real socket in a background thread, and talk to it over HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import logging
import socket
import threading
import time
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from aiohttp import web
from clef_bridge.bridge.config.registry import ModelSpec, Registry, ServerSpec, demo_registry
from clef_bridge.bridge.model.loading import Loaded
from clef_bridge.bridge.server.app import RUNNER_OPTIONS, create_app
from clef_bridge.bridge.server.appstate import Loader
from clef_bridge.bridge.service.models import load_models
from clef_bridge.head.schema import Limits

LIMIT_KEYS = {f.name for f in fields(Limits)}


def registry_for(spec: ModelSpec, path: Path, **server: Any) -> Registry:
    """A registry serving spec; server takes [server] keys of models.toml (limits included)."""
    limits = Limits(**{k: v for k, v in server.items() if k in LIMIT_KEYS})
    rest = {k: v for k, v in server.items() if k not in LIMIT_KEYS}
    return Registry(path=path, default=spec.name, models={spec.name: spec}, server=ServerSpec(**rest, limits=limits))


class LogTap(logging.Handler):
    """Every log record of the process while a RunningServer runs: access lines, aiohttp's errors."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


class RunningServer:
    def __init__(self, registry: Registry, loader: Loader = load_models, api_key: str | None = None):
        self.registry = registry
        self.api_key = api_key  # sent by metric(): with auth on, /metrics takes a scope=metrics key only
        self.app = create_app(registry, loader)
        self.loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, daemon=True)
        self.port = 0
        self.tap = LogTap()
        self._access_logger = logging.getLogger("clef_bridge.access")
        self._access_level = self._access_logger.level

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._start())
        except BaseException as exc:  # noqa: BLE001 - reported to the test thread
            self._error = exc
            self._started.set()
            return
        self._started.set()
        self.loop.run_forever()

    async def _start(self) -> None:
        self.runner = web.AppRunner(self.app, **RUNNER_OPTIONS)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]

    def __enter__(self) -> "RunningServer":
        logging.getLogger().addHandler(self.tap)
        self._access_logger.setLevel(logging.INFO)
        self._thread.start()
        self._started.wait(120)
        if self._error:
            raise self._error
        return self

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(120)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)
        logging.getLogger().removeHandler(self.tap)
        self._access_logger.setLevel(self._access_level)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def request(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None,
                raw: bytes | None = None, timeout: float = 120) -> "Reply":
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        hdrs = {"Content-Type": "application/json"} if data is not None else {}
        hdrs.update(headers or {})
        conn.request(method, path, body=data, headers=hdrs)
        resp = conn.getresponse()
        payload = resp.read()
        conn.close()
        return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, payload)

    def post(self, body: Any, **kw) -> "Reply":
        return self.request("POST", "/v1/systemone", body, **kw)

    def raw(self, data: bytes, timeout: float = 30) -> "Reply":
        """Bytes as they are (any header bytes) on a new connection, and the one response they get."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as sock:
            sock.sendall(data)
            resp = http.client.HTTPResponse(sock)
            resp.begin()
            payload = resp.read()
        return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, payload)

    def access_lines(self) -> list[dict]:
        return [json.loads(r.getMessage()) for r in list(self.tap.records) if r.name == "clef_bridge.access"]

    def access_line(self, match: Callable[[dict], bool], timeout: float = 10) -> dict:
        """The access-log line matching, waiting for it (a line is written once the response is sent)."""
        deadline = time.monotonic() + timeout
        while True:
            found = [line for line in self.access_lines() if match(line)]
            if found or time.monotonic() > deadline:
                assert len(found) == 1, found
                return found[0]
            time.sleep(0.02)

    def tracebacks(self) -> list[logging.LogRecord]:
        return [r for r in list(self.tap.records) if r.exc_info]

    def metric(self, name: str, **labels: str) -> float:
        """Sum of a metric's samples whose labels include these."""
        key = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        return metric_sum(self.request("GET", "/metrics", headers=key).body.decode(), name, **labels)


def metric_sum(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of a metric in a /metrics page whose labels include these."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            head, value = line.rsplit(" ", 1)
            if all(f'{k}="{v}"' in head for k, v in labels.items()) and head.split("{")[0] == name:
                total += float(value)
    return total


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def refusal(reply: Reply, status: int, loc: list | None) -> dict:
    """The first problem of a refused request, checked in the Jev shape: a 422's {loc, msg, type} list (the first
    loc starting with loc), or another status's {error_type, message}."""
    assert reply.status == status, (reply.status, reply.body[:400])
    payload = reply.json()
    if status != 422:
        assert set(payload["detail"]) == {"error_type", "message"}
        return payload["detail"]
    assert all(set(p) == {"loc", "msg", "type"} and p["msg"] for p in payload["detail"])
    assert payload["detail"][0]["loc"][:len(loc)] == loc, payload
    return payload["detail"][0]


def strip_extensions(response: dict) -> dict:
    return {k: v for k, v in response.items() if not k.startswith("x_")}


class WrappedModel:
    """A real, checked ClefModel with some methods overridden by a subclass; the rest passes through."""

    def __init__(self, model):
        self._model = model

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


def wait_until(condition: Callable[[], Any], what: str, timeout: float = 30) -> None:
    """Poll condition until it holds: tests order events by state, never by a sleep of a guessed length."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:g} s for {what}")
        time.sleep(0.01)


class SlowModel(WrappedModel):
    """A real, checked model whose batches take at least `delay` seconds, counting what it decides;
    `started` is set once a batch has reached the backbone (so a test knows the worker is busy)."""

    def __init__(self, model, delay: float):
        super().__init__(model)
        self.delay, self.decided = delay, 0
        self.started = threading.Event()

    def prefill_batch(self, batch):
        self.started.set()
        time.sleep(self.delay)  # the batch's work, made long: not an ordering
        self.decided += len(batch)
        return self._model.prefill_batch(batch)


def slow_loader(delay: float) -> Loader:
    def load(registry: Registry) -> dict[str, Loaded]:
        loaded = load_models(registry)
        return {name: replace(item, model=SlowModel(item.model, delay)) for name, item in loaded.items()}
    return load


def with_spec(spec: ModelSpec, **changes: Any) -> ModelSpec:
    return replace(spec, **changes)


@contextlib.contextmanager
def demo_server(folder: Path) -> Iterator[RunningServer]:
    """`clef-bridge serve` without a models.toml: the built-in demos (Clef-flash's and Clef-omni's, every medium),
    their files made under folder."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CLEF_BRIDGE_CACHE", str(folder / "cache"))
        with RunningServer(demo_registry(folder / "models.toml")) as running:
            yield running
