"""A real `cairn up` per test session (plaintext, and one over mutual TLS with a tokens file),
and the client under test in each flavour: `Client`, and `AsyncClient` driven through a bridge
that runs its coroutines on an event loop thread, so one suite tests both."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import cairn_client
from cairn_client import _async

REPO = Path(__file__).resolve().parents[3]


def cairn_bin() -> str:
    given = os.environ.get("CAIRN_BIN")
    if given:
        return given
    target = os.environ.get("CARGO_TARGET_DIR", str(REPO / "target"))
    path = Path(target) / "debug" / "cairn"
    if not path.is_file():
        pytest.fail(f"no cairn binary at {path}: run `cargo build -p cairn-cli` or set CAIRN_BIN")
    return str(path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def open_dir(prefix: str) -> Path:
    """A temporary directory that the local sandbox backend's user may traverse."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(0o755)
    return path


class Server:
    """`cairn up` on 127.0.0.1:port over a data root; stop() kills it, start() again reuses
    both (a restart)."""

    def __init__(
        self, root: Path, args: list[str] | None = None, env: dict[str, str] | None = None
    ) -> None:
        self.root = root
        self.data = root / "data"
        self.data.mkdir(mode=0o755, exist_ok=True)
        self.port = free_port()
        self.addr = f"127.0.0.1:{self.port}"
        self.args = args or []
        self.env = dict(os.environ, **(env or {}))
        if shutil.which("bwrap") and os.environ.get("CAIRN_REQUIRE_DOCKER") != "1":
            # The local backend needs no Docker engine.
            self.env.setdefault("CAIRN_SANDBOX_RUNNER_BACKEND", "local")
        for name in ("CAIRN_ADDR", "CAIRN_TOKEN", "CAIRN_TLS_DIR", "CAIRN_CONFIG"):
            self.env.pop(name, None)
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = root / "cairn.log"

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    cairn_bin(),
                    "--data-root",
                    str(self.data),
                    "up",
                    "--listen",
                    self.addr,
                    "--no-console",
                    *self.args,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"cairn up exited {self.proc.returncode}:\n{self.log.read_text()}")
            if "cairn is up on" in self.log.read_text().split("--- start ---")[-1]:
                return
            time.sleep(0.05)
        pytest.fail(f"cairn up did not start in 30 s:\n{self.log.read_text()}")

    def stop(self, sig: int = signal.SIGKILL) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)
        with open(self.log, "a") as log:
            log.write("\n--- start ---\n")

    def cli(self, *args: str) -> str:
        return subprocess.run(
            [cairn_bin(), *args], check=True, capture_output=True, text=True, env=self.env
        ).stdout


@pytest.fixture(scope="session")
def plain_server() -> Iterator[Server]:
    root = open_dir("cairn-py-plain-")
    server = Server(root)
    server.start()
    yield server
    server.stop(signal.SIGTERM)
    shutil.rmtree(root, ignore_errors=True)


class Secure:
    def __init__(self, server: Server, tls_dir: Path, admin: str, viewer: str) -> None:
        self.server, self.tls_dir, self.admin, self.viewer = server, tls_dir, admin, viewer


def token_of(output: str) -> str:
    """The token printed by `cairn tokens add` (its one line without spaces)."""
    for line in output.splitlines():
        word = line.strip()
        if word and " " not in word and len(word) >= 20:
            return word
    raise AssertionError(f"no token in {output!r}")


@pytest.fixture(scope="session")
def secure_server() -> Iterator[Secure]:
    root = open_dir("cairn-py-tls-")
    tls_dir, tokens = root / "pki", root / "tokens.toml"
    server = Server(root, ["--tls-dir", str(tls_dir), "--tokens-file", str(tokens)])
    server.cli("certs", "init", "--out", str(tls_dir))
    admin = token_of(server.cli("tokens", "add", "--file", str(tokens), "ada", "--role", "admin"))
    viewer = token_of(server.cli("tokens", "add", "--file", str(tokens), "vic", "--role", "viewer"))
    server.start()
    yield Secure(server, tls_dir, admin, viewer)
    server.stop(signal.SIGTERM)
    shutil.rmtree(root, ignore_errors=True)


# -- the async client, driven from synchronous tests ----------------------------------------------


class Bridge:
    """An event loop on a thread; `run` waits for a coroutine there."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


class Synced:
    """An object of the async client seen as the sync client's: awaitables are awaited, async
    iterators iterated, `async with` used as `with`."""

    def __init__(self, target: Any, bridge: Bridge) -> None:
        self._t, self._b = target, bridge

    def _wrap(self, value: Any) -> Any:
        if asyncio.iscoroutine(value):
            return self._wrap(self._b.run(value))
        if hasattr(value, "__anext__"):
            return self._iterate(value)
        if type(value).__module__ == _async.__name__:
            return Synced(value, self._b)
        return value

    def _iterate(self, agen: Any) -> Iterator[Any]:
        try:
            while True:
                try:
                    yield self._b.run(agen.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            if hasattr(agen, "aclose"):
                self._b.run(agen.aclose())

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._t, name)
        if type(attr).__module__ == _async.__name__:
            return Synced(attr, self._b)
        if callable(attr) and not isinstance(attr, type):
            return lambda *a, **kw: self._wrap(attr(*a, **kw))
        return self._wrap(attr)

    def __call__(self, *a: Any, **kw: Any) -> Any:
        return self._wrap(self._t(*a, **kw))

    def __enter__(self) -> Synced:
        return Synced(self._b.run(self._t.__aenter__()), self._b)

    def __exit__(self, *exc: object) -> None:
        self._b.run(self._t.__aexit__(*exc))


def make_client(flavour: str, **kw: Any) -> tuple[Any, Any]:
    """The client of `flavour` (sync | async) and a function that closes it."""
    if flavour == "sync":
        c = cairn_client.Client(**kw)
        return c, c.close
    bridge = Bridge()
    ac = cairn_client.AsyncClient(**kw)

    def close() -> None:
        bridge.run(ac.close())
        bridge.close()

    return Synced(ac, bridge), close


def tls_options(secure: Secure) -> dict[str, Any]:
    return {"tls_dir": secure.tls_dir, "token": secure.admin}


@pytest.fixture(params=["sync", "async", "sync-mtls", "async-mtls"])
def client(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A client on its own project, in each flavour; `-mtls` ones over mutual TLS with an
    admin token of the tokens file."""
    flavour = str(request.param)
    if flavour.endswith("-mtls"):
        secure = request.getfixturevalue("secure_server")
        options = {"addr": secure.server.addr, **tls_options(secure)}
    else:
        options = {"addr": request.getfixturevalue("plain_server").addr}
    project = f"py-{uuid.uuid4().hex[:10]}"
    c, close = make_client(flavour.split("-")[0], project=project, **options)
    c.flavour = flavour  # type: ignore[attr-defined]
    yield c
    close()
