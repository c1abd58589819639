"""Replicas of the same server behind Ray Serve: its proxy balances, Serve autoscales and restarts them.

Serve's HTTP ingress is ASGI; the server is aiohttp. Each replica runs the real app (server.create_app:
its routes, validation, error shapes, auth, metrics and access log) on a private unix socket, and the
replica's ASGI ingress passes every request through unchanged (method, path, query, headers, body,
streamed) and streams the answer back. So there is one server, and the replica adds only the hop.
Needs the `ray` extra (pip install 'clef-bridge[ray]'); bridge/scale/ray_plan.py plans the replicas.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import aiohttp
import ray
from aiohttp import web
from ray import serve

from ..config.registry import Registry, RegistryError, load_registry
from ..server.app import RUNNER_OPTIONS, banner, create_app
from .ray_plan import (
    DASHBOARD_URL,
    LOCAL_ONLY_ENV,
    LOOPBACK,
    RayNotLocal,
    ReplicaPlan,
    local_ports,
    local_ray_options,
    plan_replicas,
)

log = logging.getLogger("clef_bridge.ray")

APP_NAME = "clef-bridge"
REPLICA_HEADER = "x-clef-replica"  # which replica answered: the name of its socket, its log's replica id
# hop-by-hop headers belong to one connection (RFC 9110 7.6.1); uvicorn writes its own date and server
REQUEST_DROP = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer", b"transfer-encoding",
                          b"upgrade", b"expect"})
RESPONSE_DROP = REQUEST_DROP | {b"date", b"server"}


def socket_dir(app_name: str = APP_NAME) -> Path:
    """Where a node's replicas put their sockets, one <replica id>.sock each (GET /metrics there: one replica's)."""
    return Path(tempfile.gettempdir()) / f"clef-bridge-{os.getuid()}" / app_name


class Forward:
    """ASGI app passing each HTTP request unchanged to the replica's aiohttp app and streaming its answer back."""

    def __init__(self, session: aiohttp.ClientSession, replica: str):
        self.session, self.replica = session, replica

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":  # the aiohttp app has its own start and stop (ClefReplica)
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":  # a websocket: no route of the API takes one, and Serve closes it
            return
        query = scope.get("query_string", b"")
        target = (scope.get("raw_path") or scope["path"].encode()) + (b"?" + query if query else b"")
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"] if k not in REQUEST_DROP]
        # Content-Length, where the client sent one, is kept: the body then streams through unchunked
        async with self.session.request(scope["method"], "http://replica" + target.decode("latin-1"),
                                        headers=headers, data=_body(receive), allow_redirects=False) as answer:
            out = [(k.lower(), v) for k, v in answer.raw_headers if k.lower() not in RESPONSE_DROP]
            await send({"type": "http.response.start", "status": answer.status,
                        "headers": out + [(REPLICA_HEADER.encode(), self.replica.encode())]})
            async for chunk in answer.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _body(receive: Any) -> AsyncIterator[bytes]:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ConnectionResetError("the client went away while sending its body")
        yield message.get("body", b"")
        if not message.get("more_body", False):
            return


def replica_grpc_on_loopback() -> None:
    """On a node at 127.0.0.1, the replica's inter-deployment gRPC server listens there too.

    Serve 2.60 opens it on [::]:0, every interface, whatever the node's address, once the replica's
    constructor returns (Replica._on_initialized); its peers reach it at the node's address, so on a
    loopback node 127.0.0.1 is all they use. The name is Serve's, looked up at that call.
    """
    from ray.serve._private import replica as serve_replica

    node = ray.util.get_node_ip_address()
    add = getattr(serve_replica, "add_port_to_grpc_server", None)
    if node not in LOOPBACK or getattr(add, "loopback", False):
        return
    if add is None:
        log.warning("WARNING: this Ray Serve has no replica.add_port_to_grpc_server: its replicas' gRPC servers may "
                    "listen on every interface (the Ray nodes' own ports are on %s)", node)
        return

    def on_node(server: Any, address: str) -> int:
        return add(server, f"{node}:0" if address == "[::]:0" else address)

    on_node.loopback = True  # type: ignore[attr-defined]
    serve_replica.add_port_to_grpc_server = on_node


@serve.deployment
@serve.ingress()
class ClefReplica:
    """One replica: the models of the registry behind the aiohttp app, on a socket only this node sees."""

    async def __init__(self, registry: Registry, sockets: str):
        logging.basicConfig(level=logging.INFO, format="%(message)s")  # the access log, as `serve` writes it
        replica_grpc_on_loopback()
        self.replica = serve.get_replica_context().replica_id.unique_id
        folder = Path(sockets)
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.socket = folder / f"{self.replica}.sock"
        self.socket.unlink(missing_ok=True)
        self.web_app = create_app(registry)  # not self.app: Serve's ingress wrapper has that name
        self.runner = web.AppRunner(self.web_app, **RUNNER_OPTIONS,  # the app holds its connection options
                                    shutdown_timeout=registry.server.request_timeout_s)
        await self.runner.setup()  # loads and checks every model; a failure fails the replica's start
        await web.UnixSite(self.runner, str(self.socket)).start()
        # no client-side timeout: the app's own request_timeout_s and body_timeout_s apply, as under `serve`
        self.session = aiohttp.ClientSession(connector=aiohttp.UnixConnector(str(self.socket), limit=0),
                                             timeout=aiohttp.ClientTimeout(total=None), auto_decompress=False,
                                             skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"))
        log.info("\n".join(banner(self.web_app, f"unix:{self.socket} (replica {self.replica})")))

    def __serve_build_asgi_app__(self) -> Forward:
        return Forward(self.session, self.replica)

    async def check_health(self) -> None:
        """Serve's health check: the app's /ready (every worker alive); raising makes Serve replace the replica."""
        async with self.session.get("http://replica/ready", timeout=aiohttp.ClientTimeout(total=10)) as answer:
            if answer.status != 200:
                raise RuntimeError(f"replica {self.replica} is not ready: {answer.status} {await answer.text()}")

    async def __del__(self) -> None:
        if hasattr(self, "session"):  # a replica whose start failed has less to close
            await self.session.close()
        if hasattr(self, "runner"):
            await self.runner.cleanup()  # the requests in flight finish first, as on SIGTERM under `serve`
            self.socket.unlink(missing_ok=True)


def build_app(plan: ReplicaPlan, sockets: str | Path | None = None) -> Any:
    """The Serve application of a plan; sockets: the replicas' socket folder (default socket_dir())."""
    deployment = ClefReplica.options(name="ClefReplica", **plan.deployment_options())
    return deployment.bind(plan.registry, str(sockets or socket_dir()))


def app(args: dict[str, str]) -> Any:
    """Application builder for Serve config files and `serve run`: import_path clef_bridge.bridge.scale.ray_serve:app,
    args {models: PATH to models.toml}."""
    registry = load_registry(args.get("models", "models.toml"))
    if registry.ray.num_gpus == "auto" and not ray.is_initialized():
        raise RegistryError(f"{registry.path}: [ray] num_gpus = \"auto\" looks at the Ray cluster, and `serve run "
                            "IMPORT_PATH` builds the app before it connects; set num_gpus (0: CPU replicas), or "
                            "serve run / serve deploy a Serve config file, or run clef-bridge serve --ray")
    gpus = ray.cluster_resources().get("GPU", 0) if registry.ray.num_gpus == "auto" else 0.0  # else: unused
    return build_app(plan_replicas(registry, gpus), args.get("sockets"))


def replica_states() -> dict[str, int]:
    """How many replicas of the app are in each state (RUNNING, STARTING, ...), from Serve's status."""
    application = serve.status().applications.get(APP_NAME)
    if application is None:
        return {}
    return {str(state): n for d in application.deployments.values() for state, n in d.replica_states.items()}


@contextmanager
def dashboard_agent_port(port: int) -> Iterator[None]:
    """ray.init takes no port for the node's dashboard agent (Ray's RayParams fixes it at 52365): during this
    block, the RayParams that ray.init builds its node from give it port. The name is Ray's, looked up at that call."""
    from ray._private import parameter

    params = parameter.RayParams
    parameter.RayParams = functools.partial(params, dashboard_agent_listen_port=port)
    try:
        yield
    finally:
        parameter.RayParams = params


def start_ray(address: str | None, dashboard: bool, port: int) -> str:
    """Join the cluster at address, or start a Ray on this machine that listens on loopback alone, its fixed
    ports after the proxy's port (local_ports); says which."""
    if address is not None:
        ray.init(address=address)
        return f"joined the Ray cluster at {address}"
    ports = local_ports(port)
    os.environ.update(ports.environ())
    with dashboard_agent_port(ports.dashboard_agent):
        ray.init(**local_ray_options(dashboard))
    node = ray.util.get_node_ip_address()
    if node not in LOOPBACK:  # Ray was imported before LOCAL_ONLY_ENV was set: its ports would be there too
        ray.shutdown()
        raise RayNotLocal(f"the Ray started here took the node address {node}, and would listen there",
                          fix=f"set {LOCAL_ONLY_ENV[0]}={LOCAL_ONLY_ENV[1]} before Ray is imported (clef-bridge "
                              "serve --ray does), or join a cluster you started on purpose: --ray-address")
    return (f"started a Ray on this machine, listening on 127.0.0.1 only; its dashboard "
            f"{'on ' + DASHBOARD_URL if dashboard else 'off (--ray-dashboard starts it)'}; fixed ports "
            f"{ports.describe()}, the others picked at random")


def run(registry: Registry, host: str, port: int, address: str | None, dashboard: bool = False) -> None:
    """`clef-bridge serve --ray`: the replicas on a Ray cluster (a local one without address) until SIGINT/SIGTERM."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if host not in LOOPBACK and not registry.server.api_keys_file:
        log.warning("WARNING: Serve's proxy binds %s and models.toml [server] sets no api_keys_file: anyone who can "
                    "reach it can run decisions on your GPUs", host)
    log.info("clef-bridge: %s", start_ray(address, dashboard, port))
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    started = False
    try:
        plan = plan_replicas(registry, ray.cluster_resources().get("GPU", 0))
        serve.start(http_options={"host": host, "port": port})  # a joined cluster's running Serve keeps its own
        started = True
        log.info("clef-bridge on Ray Serve: starting %s", plan.describe())
        serve.run(build_app(plan), name=APP_NAME, route_prefix="/")
        url = f"http://{host if ':' not in host else f'[{host}]'}:{port}"
        log.info("clef-bridge serving on %s through Ray Serve's proxy: %s; replica sockets in %s", url,
                 plan.describe(), socket_dir())
        stop.wait()
    finally:
        # only this app: each replica finishes its requests in flight (graceful_shutdown_timeout_s), and the
        # other apps of a joined cluster, its Serve and its proxies stay; a Ray this command started stops
        if started and serve.status().applications.get(APP_NAME) is not None:
            serve.delete(APP_NAME)
        ray.shutdown()
