"""How `serve --ray` runs its replicas, planned from models.toml alone, and where the Ray it starts listens
(no Ray import: checked without it, and read before Ray is imported).

One replica serves every model of the registry, as `serve` does. Serve autoscales on ongoing requests
(running and queued) per replica; a replica's worker decodes n_seq_max requests at once, so one full
batch per replica is the target, and twice that the most a replica is sent: one batch decoding while
the next one forms in its queue. More would only wait in the replica's queue instead of Serve's, where
another replica could still take them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

from ...head.errors import Category, ClefError
from ..config.registry import Registry, with_keys

LOOPBACK = ("127.0.0.1", "localhost", "::1")
# Read by Ray at import, and by every process it starts: "0" gives the node the address 127.0.0.1 (Ray's
# default on macOS and Windows), and Ray's servers then bind loopback alone (GCS, raylet, agents, workers,
# metrics). On Linux Ray otherwise takes the machine's address, even given _node_ip_address="127.0.0.1",
# and binds several of its ports on every interface.
LOCAL_ONLY_ENV = ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
DASHBOARD_URL = "http://127.0.0.1:8265"  # ray.init's dashboard_host and dashboard_port defaults
# The ports a Ray started by `serve --ray` would otherwise hold at fixed numbers (52365, 44217, 44227), each
# moved to --port + its offset, so they follow the user's choice and two such servers on one machine, their
# --port 4 or more apart, do not collide; Ray picks its other ports at random. Each: (offset, the environment
# variable Ray's processes read it from at import, or None: the dashboard agent's is an argument of the node).
RAY_PORTS = {"dashboard agent": (1, None), "autoscaler metrics": (2, "AUTOSCALER_METRIC_PORT"),
             "dashboard metrics": (3, "DASHBOARD_METRIC_PORT")}


class RayNotLocal(ClefError):
    """The Ray that `serve --ray` started would listen beyond this machine."""

    category = Category.USAGE
    error_type = "ray_not_local"


class RayPortsError(ClefError):
    """--port leaves no room for the ports the Ray that `serve --ray` starts holds after it."""

    category = Category.USAGE
    error_type = "ray_ports"


@dataclass(frozen=True)
class LocalPorts:
    """Where the Ray that `serve --ray` starts listens at fixed numbers: Serve's proxy on --port, Ray's after it."""

    proxy: int
    ray: dict[str, int]  # RAY_PORTS' names -> ports

    @property
    def dashboard_agent(self) -> int:
        return self.ray["dashboard agent"]

    def environ(self) -> dict[str, str]:
        """The ports Ray's processes read at their import: set before ray.init (the processes it starts inherit)."""
        return {env: str(self.ray[name]) for name, (_, env) in RAY_PORTS.items() if env}

    def describe(self) -> str:
        return ", ".join(f"{port} ({name})" for name, port in {"Serve's proxy": self.proxy, **self.ray}.items())


def local_ports(port: int) -> LocalPorts:
    """Serve's proxy on --port, Ray's fixed ports at their offsets after it (RAY_PORTS)."""
    last = max(offset for offset, _ in RAY_PORTS.values())
    if not 1 <= port <= 65535 - last:
        raise RayPortsError(f"--port {port}: serve --ray holds it and the {last} ports after it for the Ray it starts",
                            fix=f"pass a --port from 1 to {65535 - last}")
    return LocalPorts(port, {name: port + offset for name, (offset, _) in RAY_PORTS.items()})


def cluster_address(flag: str | None, environ: Mapping[str, str]) -> str | None:
    """The Ray cluster `serve --ray` joins: --ray-address, else RAY_ADDRESS; None: it starts a Ray of its own."""
    return flag or environ.get("RAY_ADDRESS") or None


def local_ray_options(dashboard: bool) -> dict[str, Any]:
    """ray.init's arguments for the Ray `serve --ray` starts: a new one (not a `ray start` cluster found on
    this machine), its node on loopback (with LOCAL_ONLY_ENV set before Ray's import), the dashboard only
    when asked for."""
    return {"address": "local", "_node_ip_address": "127.0.0.1", "include_dashboard": dashboard}


@dataclass(frozen=True)
class ReplicaPlan:
    """The registry each replica serves and the @serve.deployment options that run it."""

    registry: Registry  # a CPU replica's n_threads = 0 ("every core") becomes its share, num_cpus
    num_gpus: float
    num_cpus: float
    target_ongoing_requests: int
    max_ongoing_requests: int
    min_replicas: int
    max_replicas: int

    @property
    def autoscaling(self) -> bool:
        return self.max_replicas > self.min_replicas

    def deployment_options(self) -> dict[str, Any]:
        ray = self.registry.ray
        options: dict[str, Any] = {
            "ray_actor_options": {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus},
            "max_ongoing_requests": self.max_ongoing_requests,
            "health_check_period_s": ray.health_check_period_s,
            # a replica going away (scale-down, redeploy) first finishes what it holds, as `serve` does on SIGTERM
            "graceful_shutdown_timeout_s": self.registry.server.request_timeout_s,
        }
        if not self.autoscaling:
            return options | {"num_replicas": self.min_replicas}
        return options | {"autoscaling_config": {
            "min_replicas": self.min_replicas, "max_replicas": self.max_replicas,
            "target_ongoing_requests": self.target_ongoing_requests, "upscale_delay_s": ray.upscale_delay_s,
            "downscale_delay_s": ray.downscale_delay_s, "look_back_period_s": ray.look_back_period_s}}

    def describe(self) -> str:
        count = f"{self.min_replicas} replica(s)" if not self.autoscaling else \
            f"{self.min_replicas} to {self.max_replicas} replica(s), autoscaled on ongoing requests"
        device = f"{self.num_gpus:g} GPU + {self.num_cpus:g} CPU" if self.num_gpus else f"{self.num_cpus:g} CPU"
        return (f"{count}, each {device}; target {self.target_ongoing_requests} ongoing requests per replica, "
                f"at most {self.max_ongoing_requests}")


def plan_replicas(registry: Registry, cluster_gpus: float) -> ReplicaPlan:
    """The replicas for a registry on a cluster with cluster_gpus GPUs (num_gpus = "auto" looks at it)."""
    ray = registry.ray
    gpus = float(ray.num_gpus) if ray.num_gpus != "auto" else (1.0 if cluster_gpus >= 1 else 0.0)
    if not gpus:  # llama.cpp's "every core" would have each replica of a node fight over all of them
        threads = max(1, int(ray.num_cpus))
        models = {name: with_keys(spec, n_threads=threads) if spec.backbone.n_threads == 0 else spec
                  for name, spec in registry.models.items()}
        registry = replace(registry, models=models)
    target = ray.target_ongoing_requests or registry.models[registry.default].backbone.n_seq_max
    return ReplicaPlan(registry, gpus, float(ray.num_cpus), target, ray.max_ongoing_requests or 2 * target,
                       ray.min_replicas, ray.max_replicas)
