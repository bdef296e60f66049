"""deploy/ end to end: three network-namespace hosts reached over SSH, deployed by `tierserve deploy up`.

h1 runs Redis, the coordinator and a decode worker; h2 an encode worker; h3 a prefill and a combined
worker. So every request's embeddings cross from h2 to h3, and the KV cache of each request prefilled
by h3's prefill worker crosses to h1's decode worker. The test sends image requests from the root
namespace to the coordinator's address and checks each answer equals the same weights' own
`generate()`, over tcp and then nixl; that a second `up` changes nothing; that a rolling restart of h3
under a steady load loses no request; and that `down` leaves no tierserve process on any host.
Skipped with the reason where there is no root, `ip netns`, sshd or ansible-playbook.
"""

from __future__ import annotations

import asyncio
import base64
import io
import re
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml
from netns_hosts import NetnsHosts, unavailable

from benchmarks.faults.load import SteadyLoad, classify, counts, image_url, request_body
from coordinator.policies.base import PolicyConfig
from coordinator.redis_server import find_redis_server
from transport.registry import unavailable as transport_unavailable

pytestmark = [pytest.mark.slow, pytest.mark.multihost, pytest.mark.long, pytest.mark.timeout(900)]  # a deploy: ~200 s
ROOT = Path(__file__).resolve().parents[2]
TIERSERVE = str(Path(sys.executable).with_name("tierserve"))
IMAGES = [0, 1, 2, 3]
MAX_TOKENS = 8
MODEL = "tiny-llava"
POLICY = PolicyConfig.model_validate({"batch": {"name": "fixed_timeout", "timeout_s": 0.01, "max_batch": 4}})
RUN_LIMIT_S = 420
"""Bound on one ansible-playbook run."""


def _skip_reason() -> str | None:
    if (why := unavailable()) is not None:
        return why
    if not Path(sys.executable).with_name("ansible-playbook").is_file() and shutil.which("ansible-playbook") is None:
        return "ansible-playbook is not installed (make deploy-deps)"
    return None


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    if (why := _skip_reason()) is not None:
        pytest.skip(why)
    nh = NetnsHosts(tmp_path_factory.mktemp("netns")).start()
    try:
        yield nh
    finally:
        nh.stop()


def _inventory(nh: NetnsHosts, transport: str) -> dict:
    h1, h2, h3 = nh.hosts
    common = {"common_user": "root", "common_python": str(Path(sys.base_exec_prefix) / "bin" / "python3"),
              "common_site_packages_extra": [sysconfig.get_paths()["purelib"]], "common_pip_args": ["--no-index", "--no-deps"],
              "common_worker_threads": 1, "redis_install_package": False, "redis_binary": find_redis_server()}
    host_vars = {h.name: nh.inventory_vars(h) | common for h in nh.hosts}
    host_vars[h1.name]["llm_node_workers"] = [{"id": "h1-decode", "role": "decode", "gpu": 0, "tier": "cpu"}]
    host_vars[h2.name]["encode_node_workers"] = [{"id": "h2-encode", "gpu": 0, "tier": "cpu"}]
    host_vars[h3.name]["llm_node_workers"] = [{"id": "h3-prefill", "role": "prefill", "gpu": 0, "tier": "cpu"},
                                              {"id": "h3-combined", "role": "combined", "gpu": 1, "tier": "cpu"}]
    one = lambda h: {"hosts": {h.name: {}}}  # noqa: E731
    return {"all": {"vars": {"tierserve_transport": transport, "tierserve_key_prefix": "e2e",
                             "tierserve_policy": POLICY.model_dump(mode="json")},
                    "hosts": host_vars,
                    "children": {"redis": one(h1), "coordinator": one(h1), "encode": one(h2),
                                 "llm": {"children": {"decode": one(h1), "prefill": one(h3), "combined": one(h3)}}}}}


@pytest.fixture(scope="module")
def deployment(hosts, tmp_path_factory):
    """(inventory path, wheel): one wheel for every run, so that only what the test changes changes."""
    work = tmp_path_factory.mktemp("deploy")
    from coordinator.deploy.runner import build_wheel

    wheel = build_wheel(work / "dist")
    inventory = work / "cluster.yml"
    inventory.write_text(yaml.safe_dump(_inventory(hosts, "tcp")))
    yield inventory, wheel
    _deploy("down", inventory)  # nothing is left running whatever happened above


def _deploy(cmd: str, inventory: Path, *args: str) -> tuple[int, str]:
    """Run `tierserve deploy CMD -i INVENTORY ...`; (exit status, output)."""
    r = subprocess.run([TIERSERVE, "deploy", cmd, "-i", str(inventory), *args], capture_output=True, text=True,
                       timeout=RUN_LIMIT_S, cwd=ROOT)
    return r.returncode, r.stdout + r.stderr


def _changed(output: str) -> dict[str, int]:
    """The PLAY RECAP's changed count per host."""
    return {m[0]: int(m[1]) for m in re.findall(r"^(\S+)\s+:\s+ok=\d+\s+changed=(\d+)", output, re.M)}


@pytest.fixture(scope="module")
def expected(tmp_path_factory) -> dict[int, str]:
    """Each test image's answer from the model's own generate(), greedy, EOS ignored as the load asks,
    decoded as the server decodes."""
    import torch
    from PIL import Image
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    from coordinator.protocol.models import DEFAULT_MODEL_DIR

    model = LlavaForConditionalGeneration.from_pretrained(DEFAULT_MODEL_DIR).eval()
    processor = AutoProcessor.from_pretrained(DEFAULT_MODEL_DIR)
    out = {}
    for image in IMAGES:
        png = base64.b64decode(image_url(image).split(",", 1)[1])
        text = request_body(MODEL, image)["messages"][0]["content"][1]["text"]
        prompt = processor.apply_chat_template(
            [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}],
            add_generation_prompt=True)
        inputs = processor(text=prompt, images=Image.open(io.BytesIO(png)).convert("RGB"), return_tensors="pt")
        with torch.inference_mode():
            ids = model.generate(**inputs, max_new_tokens=MAX_TOKENS, do_sample=False, eos_token_id=None)
        out[image] = processor.tokenizer.decode(ids[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    return out


def _url(nh: NetnsHosts) -> str:
    return f"http://{nh.hosts[0].address}:8000"


def _answers_match(nh: NetnsHosts, expected: dict[int, str]) -> list:
    async def go():
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(*(classify(client, _url(nh), request_body(MODEL, i, max_tokens=MAX_TOKENS),
                                                   expected[i], 60, 60) for i in IMAGES * 2))
    return [(o.kind, o.detail) for o in asyncio.run(go())]


def _cluster(nh: NetnsHosts) -> dict[str, dict]:
    return {w["worker_id"]: w for w in httpx.get(f"{_url(nh)}/v1/cluster", timeout=10).json()["workers"]}


def _serves_exactly_across_hosts(nh: NetnsHosts, expected: dict[int, str], rounds: int = 4) -> None:
    """Rounds of concurrent image requests, every answer equal to generate(), until embeddings have reached both
    of h3's workers from h2 and KV caches have reached h1's decode worker from h3 (routing picks the least
    loaded worker, so one round may use one path only)."""
    accepted: dict[str, float] = {}
    for _ in range(rounds):
        results = _answers_match(nh, expected)
        assert all(kind == "served" for kind, _ in results), results
        time.sleep(1.0)  # the workers report their transfer counters with each heartbeat
        workers = _cluster(nh)
        accepted = {w: workers[w]["stats"].get("transport_accepted", 0) for w in ("h3-prefill", "h3-combined", "h1-decode")}
        if all(v > 0 for v in accepted.values()):
            return
    raise AssertionError(f"after {rounds} rounds some path never carried a transfer: {accepted}")


def test_deploy_tcp_serves_exactly_reruns_idempotently_and_restarts_without_loss(hosts, deployment, expected):
    inventory, wheel = deployment
    t0 = time.monotonic()
    rc, out = _deploy("up", inventory, "--wheel", str(wheel))
    assert rc == 0, out[-6000:]
    first_s = time.monotonic() - t0
    assert sorted(_cluster(hosts)) == ["h1-decode", "h2-encode", "h3-combined", "h3-prefill"]
    admin = yaml.safe_load(inventory.with_name("cluster.secrets.yml").read_text())["tierserve_admin_token"]
    policy = httpx.get(f"{_url(hosts)}/v1/admin/policy", headers={"Authorization": f"Bearer {admin}"}, timeout=10)
    assert PolicyConfig.model_validate(policy.json()) == POLICY

    _serves_exactly_across_hosts(hosts, expected)

    t1 = time.monotonic()
    rc, out = _deploy("up", inventory, "--wheel", str(wheel))
    assert rc == 0, out[-6000:]
    changed = _changed(out)
    assert set(changed) == {"h1", "h2", "h3"} and not any(changed.values()), (changed, out[-6000:])
    print(f"\nfirst up {first_s:.0f} s, second up {time.monotonic() - t1:.0f} s: {changed}")

    # A rolling restart of h3 under a steady load: every request is served, and served right.
    pids = {w: _cluster(hosts)[w]["pid"] for w in ("h3-prefill", "h3-combined")}
    stop = threading.Event()
    restart: dict = {}

    def restart_h3():
        restart["result"] = _deploy("restart", inventory, "--limit", "h3")
        stop.set()

    async def load():
        done = asyncio.Event()
        steady = SteadyLoad(_url(hosts), MODEL, expected, rate=1.0, max_tokens=MAX_TOKENS, timeout_s=90)
        task = asyncio.create_task(steady.run(done, max_requests=400))
        await asyncio.sleep(2)
        threading.Thread(target=restart_h3, daemon=True).start()
        while not stop.is_set():
            await asyncio.sleep(0.2)
        await asyncio.sleep(2)
        done.set()
        return await task

    outcomes = asyncio.run(load())
    rc, out = restart["result"]
    assert rc == 0, out[-6000:]
    c = counts(outcomes)
    print(f"rolling restart of h3 under load: {c}")
    assert c["sent"] >= 5 and c["served"] == c["sent"], ([o for o in outcomes if o.kind != "served"], c)
    after = _cluster(hosts)
    assert all(after[w]["pid"] != pid for w, pid in pids.items()), (pids, after)


def test_deploy_nixl_serves_exactly(hosts, deployment, expected):
    if (why := transport_unavailable("nixl")) is not None:
        pytest.skip(why)
    inventory, wheel = deployment
    rc, out = _deploy("up", inventory, "--wheel", str(wheel), "--transport", "nixl")
    assert rc == 0, out[-6000:]
    _serves_exactly_across_hosts(hosts, expected)


def test_status_then_down_leaves_no_tierserve_process(hosts, deployment):
    inventory, _ = deployment
    rc, out = _deploy("status", inventory)
    assert rc == 0 and "h3-combined" in out, out[-4000:]
    rc, out = _deploy("down", inventory)
    assert rc == 0, out[-6000:]
    left = [cmd for h in hosts.hosts for cmd in hosts.processes(h)
            if any(k in cmd for k in ("tierserve", "encode_node", "llm_node", "coordinator", "redis", "supervisor"))]
    assert left == [], left
