"""The manifests of deploy/ say true things about clef-bridge, and the docs link them rather than paste them.

No cluster here: what is checked is each manifest's part in clef-bridge (the app builder it names,
the command it runs, the routes it probes, the metric it scales on, the models.toml it reads).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml
from clef_bridge.bridge.config.registry import load_registry
from clef_bridge.bridge.scale.ray_plan import plan_replicas
from clef_bridge.bridge.server.app import setup_routes
from clef_bridge.bridge.server.prometheus import create_metrics
from clef_bridge.tools.cliargs import build_parser

from .test_readme import PAGES, blocks

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"


def manifests(name: str) -> dict[str, dict]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all((DEPLOY / name).read_text())}


@pytest.mark.parametrize("name", ["models.toml", "rayservice.yaml", "kubernetes.yaml"])
def test_the_docs_link_each_file_and_paste_none(name):
    """The manifests live only in deploy/: docs/ray.md links each one, and no page holds a copy of one."""
    assert f"](../deploy/{name})" in (ROOT / "docs" / "ray.md").read_text(encoding="utf-8")
    text = (DEPLOY / name).read_text().strip()
    assert [p.name for p in PAGES if text in p.read_text(encoding="utf-8")] == []
    assert [tags for _, tags, _ in blocks() if f"deploy/{name}" in tags] == []


def test_models_toml_asks_for_one_gpu_per_replica_even_before_gpus_exist():
    registry = load_registry(DEPLOY / "models.toml")
    plan = plan_replicas(registry, cluster_gpus=0)  # the GPU workers of an autoscaling cluster may not exist yet
    assert plan.num_gpus == 1 and plan.autoscaling and plan.target_ongoing_requests == 8
    assert registry.server.api_keys_file == Path("/secrets/keys.txt")


def test_rayservice_runs_the_app_builder_on_the_models_volume():
    service = manifests("rayservice.yaml")["RayService"]
    serve_config = yaml.safe_load(service["spec"]["serveConfigV2"])
    (application,) = serve_config["applications"]
    module, name = application["import_path"].split(":")
    assert module == "clef_bridge.bridge.scale.ray_serve"
    tree = ast.parse(ROOT.joinpath(*module.split(".")[1:]).with_suffix(".py").read_text())  # bridge/scale/ray_serve.py
    assert name in {f.name for f in tree.body if isinstance(f, ast.FunctionDef)}
    assert application["args"]["models"] == "/models/models.toml" and application["route_prefix"] == "/"
    cluster = service["spec"]["rayClusterConfig"]
    pods = [cluster["headGroupSpec"]] + cluster["workerGroupSpecs"]
    for pod in pods:  # the builder reads models.toml on the head, the replicas load the models on the workers
        mounts = {m["mountPath"] for m in pod["template"]["spec"]["containers"][0]["volumeMounts"]}
        assert {"/models", "/secrets"} <= mounts
    (gpu,) = cluster["workerGroupSpecs"]
    assert gpu["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert gpu["maxReplicas"] == load_registry(DEPLOY / "models.toml").ray.max_replicas


def test_kubernetes_runs_serve_probes_real_routes_and_scales_on_the_queue_gauge():
    docs = manifests("kubernetes.yaml")
    container = docs["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    command, *args = container["args"]
    parsed = build_parser().parse_args(args)
    assert command == "clef-bridge" and parsed.command == "serve" and not parsed.ray
    assert str(parsed.models) == "/models/models.toml" and parsed.port == container["ports"][0]["containerPort"]
    from aiohttp import web

    app = web.Application()
    setup_routes(app)
    routes = {r.resource.canonical for r in app.router.routes()}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] in routes
    (trigger,) = docs["ScaledObject"]["spec"]["triggers"]
    metric = trigger["metadata"]["query"].split("(", 1)[1].split("{")[0]
    assert metric in {m.name for m in create_metrics().registry.collect()} and metric == "clef_queue_depth"
    assert docs["ScaledObject"]["spec"]["scaleTargetRef"]["name"] == docs["Deployment"]["metadata"]["name"]
    assert docs["Service"]["spec"]["selector"] == docs["Deployment"]["spec"]["selector"]["matchLabels"]
