"""`serve --ray` on this machine with the demo model: Ray Serve's proxy in front of real replicas.

Ray is slow to start, so one Ray serves the module and the tests are few: the one command; jevcompat
and 200 mixed requests through the proxy over 2 replicas, counted by the replicas' own metrics; a
replica killed under load; autoscaling from 1 to 2. They need the `ray` extra, which tests/run.sh
installs (docs/ray.md): they skip without it on a developer's machine and fail without it in CI
(CI=true).
"""

from __future__ import annotations

import gzip
import http.client
import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from clef_bridge.bridge.config.registry import RaySpec, demo_registry, load_registry, with_keys
from clef_bridge.bridge.model.loading import materialize
from clef_bridge.bridge.scale.ray_plan import local_ports, plan_replicas

from .serverkit import metric_sum
from .test_server_clients import _free_port

# Ray's own deadlines inside these tests reach 240 s after a cluster start: more than the suite's 300 s
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
NO_RAY = "Ray Serve is not installed: pip install 'clef-bridge[ray]' (tests/run.sh does)"
try:
    import ray
    from clef_bridge.bridge.scale import ray_serve
    from ray import serve
except ImportError as exc:
    # a developer without the extra skips these; CI (CI=true) runs everything, so there they fail
    if os.environ.get("CI", "").lower() not in ("true", "1"):
        pytest.skip(f"{NO_RAY} ({exc})", allow_module_level=True)
    ray = serve = ray_serve = None
    RAY_MISSING = f"{NO_RAY} ({exc}); CI=true runs every test, so Ray's tests fail here instead of skipping"
else:
    RAY_MISSING = ""


@pytest.fixture(scope="module", autouse=True)
def ray_installed():
    """First of the module's fixtures: without Ray (in CI) each test fails with why, before any starts Ray."""
    if RAY_MISSING:
        pytest.fail(RAY_MISSING, pytrace=False)


KEY = "ray-test-key"
METRICS_KEY = "ray-metrics-key"  # /metrics takes a scope=metrics key only (docs/api.md, tenants and isolation)
KEYS_FILE = f"{KEY}\n{METRICS_KEY} name=prometheus scope=metrics\n"
AUTH = {"Authorization": f"Bearer {KEY}"}
WORKERS_AI = "/accounts/{account_id}/ai/run/@cf/cloudflare/{model}"
SENT_ROUTES = ("/v1/systemone", WORKERS_AI, "/v1/models")  # not /ready (Serve's health checks) nor /metrics


@dataclass
class Outcome:
    status: int  # 0: the connection failed (what the client saw is in error)
    replica: str
    body: bytes
    error: str = ""
    at: float = 0.0


def call(port: int, method: str, path: str, body=None, headers=None, timeout: float = 60) -> Outcome:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    data = None if body is None else json.dumps(body).encode()
    try:
        conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        return Outcome(resp.status, resp.getheader(ray_serve.REPLICA_HEADER, ""), resp.read(), at=time.time())
    except OSError as exc:  # refused, reset, timed out: the client sees it
        return Outcome(0, "", b"", f"{type(exc).__name__}: {exc}", at=time.time())
    finally:
        conn.close()


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: Path):
        super().__init__("replica", timeout=10)
        self.socket_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(str(self.socket_path))


def replica_pages(sockets: Path, path: str = "/metrics") -> dict[str, str]:
    """Each live replica's own page (its /metrics by default) by replica id, over its private socket."""
    pages = {}
    for sock in sorted(sockets.glob("*.sock")):
        conn = UnixHTTPConnection(sock)
        try:
            key = METRICS_KEY if path == "/metrics" else KEY
            conn.request("GET", path, headers={"Authorization": f"Bearer {key}"})
            resp = conn.getresponse()
            if resp.status == 200:
                pages[sock.stem] = resp.read().decode()
        except OSError:  # a dead replica's socket file refuses
            continue
        finally:
            conn.close()
    return pages


def answered(sockets: Path) -> dict[str, int]:
    """Requests each live replica answered on the routes the tests send, from its clef_requests counter."""
    return {rid: int(sum(metric_sum(page, "clef_requests_total", route=r) for r in SENT_ROUTES))
            for rid, page in replica_pages(sockets).items()}


def decision(i: int, kind: str = "noul") -> dict:
    questions = {"noul": {"q": {"type": "noul", "instructions": "Is it urgent?"}},
                 "choice": {"team": {"type": "choice", "criteria": {"Billing": "invoices", "Technical": None}}},
                 "score": {"anger": {"type": "score", "criteria": ["Calm", "Annoyed", "Furious"]}}}[kind]
    return {"model": "jev-latest", "state": f"Ticket {i}: the invoice was charged twice.", "questions": questions}


def mixed(i: int) -> tuple[str, str, dict | None, dict, int]:
    """Request i of a mixed load: method, path, body, headers and the status it must get."""
    workers_ai = f"/accounts/acc{i}/ai/run/@cf/cloudflare/clef-flash"
    bad = {**decision(i), "questions": {"q": {"type": "bogus"}}}
    return [("POST", "/v1/systemone", decision(i, "noul"), AUTH, 200),
            ("POST", "/v1/systemone", decision(i, "choice"), AUTH, 200),
            ("POST", "/v1/systemone", decision(i, "score"), AUTH, 200),
            ("POST", workers_ai, decision(i, "score"), AUTH, 200),
            ("POST", "/v1/systemone", bad, AUTH, 422),
            ("POST", workers_ai, bad, AUTH, 422),
            ("POST", "/v1/systemone", decision(i), {}, 401),
            ("GET", "/v1/models", None, AUTH, 200)][i % 8]


def check_body(i: int, outcome: Outcome) -> None:
    """The body request i must get: the same shapes as `serve` (422 detail list, Workers AI envelope)."""
    method, path, _, _, status = mixed(i)
    assert outcome.status == status, (i, outcome)
    body = json.loads(outcome.body)
    if path.startswith("/accounts/"):
        assert body["success"] is (status == 200), body
        assert "answers" in body["result"] if status == 200 else body["errors"][0]["code"] == 422
    elif status == 422:
        assert body["detail"][0]["loc"] == ["body", "questions", "q", "type"], body
    elif status == 401:
        assert body["detail"]["error_type"] == "authentication_error", body
    elif method == "GET":
        assert body["models"][0]["name"] == "demo", body
    else:
        assert len(body["answers"]) == 1 and body["usage"]["input_tokens"] > 0, body


def demo(keys: Path, ray_spec: RaySpec):
    registry = demo_registry(keys.parent / "models.toml")
    spec = with_keys(registry.models["demo"], question_ids="blind")  # jevcompat's MUSTs (docs/api.md, "Conformance")
    materialize(spec)
    server = replace(registry.server, api_keys_file=keys)
    return replace(registry, models={"demo": spec}, server=server, ray=ray_spec)


def deploy(registry, sockets: Path):
    plan = plan_replicas(registry, cluster_gpus=0)
    serve.run(ray_serve.build_app(plan, sockets), name=ray_serve.APP_NAME, route_prefix="/")
    return plan


def process_tree(root: int) -> set[int]:
    """root and every process descended from it, from /proc's parent ids."""
    parents = {}
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text() if entry.name.isdigit() else ""
        except OSError:  # gone meanwhile
            continue
        if stat:
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    tree, grown = {root}, True
    while grown:
        children = {pid for pid, parent in parents.items() if parent in tree} - tree
        tree, grown = tree | children, bool(children)
    return tree


def _address(hex_address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    raw = bytes.fromhex(hex_address)  # /proc/net/tcp*: 32-bit words in host (little-endian) order
    return ipaddress.ip_address(b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4)))


def listening(pids: set[int]) -> list[tuple[int, str, str, int]]:
    """(pid, process name, address, port) of every TCP socket those processes listen on."""
    inodes = {}
    for pid in pids:
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                link = os.readlink(fd)
                if link.startswith("socket:["):
                    inodes[link[8:-1]] = (pid, name)
        except OSError:  # gone meanwhile, or a descriptor closed while listed
            continue
    out = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:  # state LISTEN
                address, port = cols[1].split(":")
                out.append((*inodes[cols[9]], str(_address(address)), int(port, 16)))
    return out


def loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return ip.is_loopback or bool(getattr(ip, "ipv4_mapped", None) and ip.ipv4_mapped.is_loopback)


def test_one_command_serves_through_the_proxy_and_stops_on_sigterm(tmp_path):
    """`clef-bridge serve --ray` without models.toml: the demo, through Serve's proxy, until SIGTERM; with the
    default --host 127.0.0.1, nothing the command starts listens beyond this machine, Ray's dashboard included."""
    port = _free_port()
    env = dict(os.environ, CLEF_BRIDGE_CACHE=str(tmp_path / "cache"))
    start = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "clef_bridge.tools.cli", "serve", "--ray", "--port", str(port)],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        outcome = Outcome(0, "", b"")
        while time.time() - start < 180 and proc.poll() is None and outcome.status != 200:
            time.sleep(1)
            outcome = call(port, "POST", "/v1/systemone", decision(0), timeout=10)
        assert outcome.status == 200, (outcome, proc.poll())
        assert json.loads(outcome.body)["answers"]["q"]["type"] == "noul" and outcome.replica
        print(f"serve --ray: first answer {time.time() - start:.1f} s after the command")
        if Path("/proc/net/tcp").is_file():  # Linux: the sockets of the whole process tree
            sockets = listening(process_tree(proc.pid))
            print(f"serve --ray listens on {len(sockets)} TCP sockets: {sorted(set(s[1] for s in sockets))}")
            assert (port in {s[3] for s in sockets}) and len(sockets) > 5, sockets  # the proxy, and Ray's own
            assert not [s for s in sockets if not loopback(s[2])], sockets
            assert 8265 not in {s[3] for s in sockets}, sockets  # no dashboard unless --ray-dashboard
            held = {s[3] for s in sockets}
            assert set(local_ports(port).ray.values()) <= held and not held & {52365, 44217, 44227}, sockets
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, out
        assert "through Ray Serve's proxy: 1 replica(s), each 1 CPU" in out
        assert "started a Ray on this machine, listening on 127.0.0.1 only; its dashboard off" in out
        assert f"fixed ports {port} (Serve's proxy), {port + 1} (dashboard agent)" in out
    finally:
        proc.kill()


def test_the_app_builder_refuses_auto_gpus_before_ray_is_up(tmp_path):
    """`serve run IMPORT_PATH` builds the app before connecting: "auto" would have no cluster to look at."""
    from clef_bridge.bridge.config.registry import RegistryError

    assert not ray.is_initialized()  # runs before the module's cluster starts
    (tmp_path / "models.toml").write_text('[models.demo]\nbuiltin = "demo"\n')
    with pytest.raises(RegistryError, match="set num_gpus"):
        ray_serve.app({"models": str(tmp_path / "models.toml")})
    (tmp_path / "models.toml").write_text('[models.demo]\nbuiltin = "demo"\n[ray]\nnum_gpus = 0\n')
    assert isinstance(ray_serve.app({"models": str(tmp_path / "models.toml")}), serve.Application)


@pytest.fixture(scope="module")
def cluster():
    pushes = {"RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S": "1",  # the autoscaler sees load in seconds
              "RAY_SERVE_HANDLE_AUTOSCALING_METRIC_PUSH_INTERVAL_S": "1"}
    saved = {k: os.environ.get(k) for k in pushes}
    os.environ.update(pushes)  # read by the processes ray.init starts
    port = _free_port()
    start = time.time()
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, object_store_memory=200 * 2**20)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        print(f"Ray and Serve started in {time.time() - start:.1f} s")
        yield port
    finally:
        serve.shutdown()
        ray.shutdown()
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


@pytest.fixture(scope="module")
def two_replicas(cluster, tmp_path_factory):
    folder = tmp_path_factory.mktemp("ray2")
    (folder / "keys.txt").write_text(KEYS_FILE)
    start = time.time()
    ray_spec = RaySpec(min_replicas=2, max_replicas=2, health_check_period_s=2)
    plan = deploy(demo(folder / "keys.txt", ray_spec), folder / "sockets")
    print(f"2 replicas running {time.time() - start:.1f} s after serve.run")
    assert ray_serve.replica_states() == {"RUNNING": 2}
    yield cluster, folder / "sockets", plan
    serve.delete(ray_serve.APP_NAME)


def test_two_replicas_pass_jevcompat_and_share_200_mixed_requests(two_replicas, tmp_path):
    port, sockets, _ = two_replicas
    start = time.time()
    report_path = tmp_path / "jevcompat.json"
    subprocess.run([sys.executable, "-m", "jevcompat.cli", "test", f"http://127.0.0.1:{port}", "--key", KEY,
                    "--json", str(report_path)], capture_output=True, text=True, timeout=900)
    report = json.loads(report_path.read_text())
    failed = {r["id"] for r in report["results"] if r["level"] == "MUST" and r["status"] == "fail"}
    print(f"jevcompat through Serve's proxy: {report['summary']['MUST']} in {time.time() - start:.1f} s")
    assert not failed and report["summary"]["MUST"]["passed"] >= 32 and report["summary"]["conformant"] is True

    before = answered(sockets)
    assert len(before) == 2
    start = time.time()
    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(lambda i: call(port, *mixed(i)[:4]), range(200)))
    elapsed = time.time() - start
    for i, outcome in enumerate(outcomes):
        check_body(i, outcome)
    after = answered(sockets)
    counted = {rid: after[rid] - before[rid] for rid in before}
    seen = Counter(o.replica for o in outcomes)
    print(f"200 mixed requests in {elapsed:.1f} s; answered per replica (their own clef_requests): {counted}")
    assert counted == dict(seen)  # each replica's metrics count exactly the answers that name it
    assert sum(counted.values()) == 200 and min(counted.values()) >= 40, counted
    checks = {rid: metric_sum(page, "clef_requests_total", route="/ready", status="200")
              for rid, page in replica_pages(sockets).items()}
    assert min(checks.values()) >= 3, checks  # Serve's health checks ask each replica's own /ready


def test_bodies_pass_through_as_sent(two_replicas):
    """Chunked, gzip-encoded and oversized bodies reach the app as the client sent them, and get its answers."""
    port = two_replicas[0]
    body = json.dumps(decision(7)).encode()

    def post(data, headers: dict, **kw) -> tuple[int, dict]:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request("POST", "/v1/systemone", body=data, headers={"Content-Type": "application/json", **AUTH,
                                                                  **headers}, **kw)
        resp = conn.getresponse()
        answer = (resp.status, json.loads(resp.read()))
        conn.close()
        return answer

    status, chunked = post(iter([body[:10], body[10:]]), {}, encode_chunked=True)
    assert status == 200 and chunked["answers"]["q"]["type"] == "noul"
    status, zipped = post(gzip.compress(body), {"Content-Encoding": "gzip"})
    assert status == 200 and zipped["answers"] == chunked["answers"]
    status, big = post(b"{" + b" " * (5 * 2**20) + b"}", {})  # past max_body_bytes (4 MiB)
    assert status == 413 and big["detail"]["error_type"] == "request_too_large", big


def test_a_replica_killed_under_load_is_replaced_and_no_request_is_lost_silently(two_replicas):
    port, sockets, plan = two_replicas
    victim, survivor = sorted(answered(sockets))
    outcomes: list[Outcome] = []
    lock, stop = threading.Lock(), threading.Event()
    sent = Counter()

    def client(n: int) -> None:
        for i in range(n * 10_000, n * 10_000 + 400):
            if stop.is_set():
                return
            with lock:
                sent["n"] += 1
            outcome = call(port, "POST", "/v1/systemone", decision(i), headers=AUTH)
            with lock:
                outcomes.append(outcome)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    deadline = time.time() + 240
    while len(outcomes) < 30 and time.time() < deadline:
        time.sleep(0.05)
    killed_at = time.time()
    ray.kill(ray.get_actor(f"SERVE_REPLICA::{ray_serve.APP_NAME}#ClefReplica#{victim}", namespace="serve"),
             no_restart=True)
    live: dict[str, int] = {}
    while time.time() < deadline and not (ray_serve.replica_states() == {"RUNNING": 2} and len(live) == 2):
        time.sleep(0.5)
        live = answered(sockets)
    replaced_at = time.time()
    newcomer = next(iter(set(live) - {victim, survivor}), None)
    assert newcomer and victim not in live, live  # the killed replica is gone and a new one runs
    done = len(outcomes)
    while len(outcomes) < done + 60 and time.time() < deadline:  # the load goes on over both replicas
        time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join(90)
    assert not any(t.is_alive() for t in threads)

    assert len(outcomes) == sent["n"]  # every request sent came back, one way or another
    failed = [o for o in outcomes if o.status != 200]
    for o in outcomes:
        if o.status == 200:
            assert json.loads(o.body)["answers"]["q"]["type"] == "noul"
    assert not [o for o in failed if "timed out" in o.error], failed  # none hung
    assert all(o.status >= 500 or o.error for o in failed), failed  # what failed, the client saw fail
    assert len(failed) <= plan.max_ongoing_requests, failed  # at most what the killed replica held
    assert all(o.at < replaced_at for o in failed), failed
    assert [o for o in outcomes if o.at > replaced_at and o.replica == newcomer]  # and the newcomer serves
    print(f"killed {victim} under load: replaced by {newcomer} in {replaced_at - killed_at:.1f} s; "
          f"{len(outcomes)} requests, {len(failed)} failed visibly "
          f"({Counter(f'{o.status} {o.body[:40]!r}' if o.status else o.error for o in failed)}), "
          f"after the replacement {sum(o.at > replaced_at for o in outcomes)} all answered")


def test_autoscaling_adds_a_replica_under_load(cluster, tmp_path):
    """Deployed as a Serve config file does it (the app builder reads models.toml [ray]); 1 replica, then 2."""
    port = cluster
    serve.delete(ray_serve.APP_NAME)
    (tmp_path / "keys.txt").write_text(KEYS_FILE)
    # look_back_period_s above Serve's deprecated 10 s metrics_interval_s, which it warns about below that
    (tmp_path / "models.toml").write_text('default = "demo"\n[models.demo]\nbuiltin = "demo"\n[server]\n'
                                          'api_keys_file = "keys.txt"\n[ray]\nmin_replicas = 1\nmax_replicas = 2\n'
                                          'upscale_delay_s = 0\nlook_back_period_s = 11\n')
    plan = plan_replicas(load_registry(tmp_path / "models.toml"), cluster_gpus=0)  # what the builder plans
    assert plan.autoscaling and plan.target_ongoing_requests == 8  # the demo's n_seq_max
    application = ray_serve.app({"models": str(tmp_path / "models.toml"), "sockets": str(tmp_path / "sockets")})
    serve.run(application, name=ray_serve.APP_NAME, route_prefix="/")
    assert ray_serve.replica_states() == {"RUNNING": 1}
    stop, start = threading.Event(), time.time()

    def client(n: int) -> None:
        for i in range(n * 10_000, n * 10_000 + 2000):
            if stop.is_set():
                return
            call(port, "POST", "/v1/systemone", decision(i), headers=AUTH)

    with ThreadPoolExecutor(32) as pool:  # 32 ongoing: 4 replicas' worth of the target, capped at 2
        for n in range(32):
            pool.submit(client, n)
        counts: dict[str, int] = {}
        scaled_at = 0.0
        while time.time() - start < 150 and not (len(counts) == 2 and min(counts.values()) >= 20):
            time.sleep(1)
            counts = answered(tmp_path / "sockets")
            scaled_at = scaled_at or (time.time() if len(counts) == 2 else 0.0)
        stop.set()
    print(f"autoscaled from 1 to 2 replicas {scaled_at - start:.1f} s into the load; answered: {counts}")
    assert ray_serve.replica_states() == {"RUNNING": 2}
    assert len(counts) == 2 and min(counts.values()) >= 20, counts  # and the new replica takes its share
    serve.delete(ray_serve.APP_NAME)
