"""models.toml [ray] and the replica plan of `serve --ray` (no Ray needed: tests/test_ray_serve.py runs it)."""

from __future__ import annotations

import sys

import pytest
from clef_bridge.bridge.config.registry import RaySpec, RegistryError, parse_registry
from clef_bridge.bridge.scale.ray_plan import RayPortsError, local_ports, plan_replicas
from clef_bridge.tools.cli import main

pytestmark = pytest.mark.unit

DEMO = {"default": "demo", "models": {"demo": {"builtin": "demo"}}}


def test_ray_table_is_parsed_and_every_problem_reported(tmp_path):
    registry = parse_registry({**DEMO, "ray": {"min_replicas": 2, "max_replicas": 6, "num_gpus": 0.5,
                                               "look_back_period_s": 5}}, tmp_path / "models.toml")
    assert registry.ray == RaySpec(min_replicas=2, max_replicas=6, num_gpus=0.5, look_back_period_s=5)
    assert parse_registry(DEMO, tmp_path / "models.toml").ray == RaySpec()
    with pytest.raises(RegistryError) as err:
        parse_registry({**DEMO, "ray": {"min_replicas": 3, "max_replicas": 2}}, tmp_path / "models.toml")
    assert "ray: min_replicas (3) exceeds max_replicas (2)" in str(err.value)
    with pytest.raises(RegistryError) as err:
        parse_registry({**DEMO, "ray": {"num_gpus": "lots", "num_cpus": 0, "replicas": 2, "min_replicas": 0}},
                       tmp_path / "models.toml")
    text = str(err.value)
    assert "4 problem(s)" in text and "ray.num_gpus: a number of GPUs" in text
    assert "ray.num_cpus: must be above 0" in text
    assert "ray.replicas: unknown key; did you mean min_replicas? known keys: " in text
    assert "ray.min_replicas: must be positive" in text


def test_cpu_replicas_take_their_threads_and_a_batch_sets_the_target(tmp_path):
    raw = {**DEMO, "models": {"demo": {"builtin": "demo", "n_seq_max": 4}}, "ray": {"num_cpus": 3}}
    plan = plan_replicas(parse_registry(raw, tmp_path / "models.toml"), cluster_gpus=0)
    assert (plan.num_gpus, plan.num_cpus) == (0, 3)
    assert plan.registry.models["demo"].backbone.n_threads == 3  # "every core" would oversubscribe the node
    assert (plan.target_ongoing_requests, plan.max_ongoing_requests) == (4, 8)
    options = plan.deployment_options()
    assert options["num_replicas"] == 1 and "autoscaling_config" not in options
    assert options["ray_actor_options"] == {"num_cpus": 3, "num_gpus": 0}
    assert options["max_ongoing_requests"] == 8 and options["graceful_shutdown_timeout_s"] == 60


def test_gpu_replicas_autoscale_between_min_and_max(tmp_path):
    raw = {**DEMO, "models": {"demo": {"builtin": "demo", "n_seq_max": 16, "n_threads": 2}},
           "ray": {"min_replicas": 1, "max_replicas": 4, "upscale_delay_s": 5}}
    registry = parse_registry(raw, tmp_path / "models.toml")
    plan = plan_replicas(registry, cluster_gpus=8)
    assert plan.num_gpus == 1 and plan.registry == registry  # the GPU replica's models are served as written
    scaling = plan.deployment_options()["autoscaling_config"]
    assert scaling == {"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 16, "upscale_delay_s": 5,
                       "downscale_delay_s": 600.0, "look_back_period_s": 30.0}
    assert "num_replicas" not in plan.deployment_options()
    assert "1 to 4 replica(s)" in plan.describe() and "1 GPU" in plan.describe()
    explicit = parse_registry({**raw, "ray": {"num_gpus": 0, "target_ongoing_requests": 3,
                                              "max_ongoing_requests": 5}}, tmp_path / "models.toml")
    plan = plan_replicas(explicit, cluster_gpus=8)
    assert (plan.num_gpus, plan.target_ongoing_requests, plan.max_ongoing_requests) == (0, 3, 5)
    assert plan.registry.models["demo"].backbone.n_threads == 2  # set in models.toml: kept


def test_serve_ray_flags_explain_themselves(tmp_path, monkeypatch, capsys):
    toml = tmp_path / "models.toml"
    toml.write_text('default = "demo"\n[models.demo]\nbuiltin = "demo"\n')
    assert main(["serve", "--models", str(toml), "--ray-address", "auto"]) == 2
    assert "add --ray" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "ray", None)  # as if the extra were not installed
    monkeypatch.delitem(sys.modules, "clef_bridge.bridge.scale.ray_serve", raising=False)
    assert main(["serve", "--models", str(toml), "--ray"]) == 2
    err = capsys.readouterr().err
    assert "--ray needs Ray Serve" in err and "pip install 'clef-bridge[ray]'" in err


def test_the_fixed_ports_of_a_local_ray_follow_the_port():
    ports = local_ports(8792)
    assert ports.ray == {"dashboard agent": 8793, "autoscaler metrics": 8794, "dashboard metrics": 8795}
    assert ports.dashboard_agent == 8793
    assert ports.environ() == {"AUTOSCALER_METRIC_PORT": "8794", "DASHBOARD_METRIC_PORT": "8795"}
    assert ports.describe() == ("8792 (Serve's proxy), 8793 (dashboard agent), 8794 (autoscaler metrics), "
                                "8795 (dashboard metrics)")
    assert local_ports(9000).ray["dashboard metrics"] == 9003
    assert local_ports(65532).ray["dashboard metrics"] == 65535
    for port in (0, 65533):
        with pytest.raises(RayPortsError, match=f"--port {port}: serve --ray holds it and the 3 ports after it"):
            local_ports(port)
