"""The `tierserve` command's errors: a message and a non-zero exit, never a traceback."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from coordinator.launcher import ClusterError, ClusterSpec


@pytest.mark.parametrize("roles,needle", [
    (["prefill"], "add one (--llm prefill,decode)"),
    (["decode"], "no LLM worker can prefill"),
    (["combined", "gpu"], "unknown LLM role"),
])
def test_cluster_spec_refuses_unusable_role_sets(roles, needle):
    with pytest.raises(ClusterError, match=re.escape(needle)):
        ClusterSpec(llm_roles=roles).validate()


def test_a_prefill_worker_beside_each_encoder_is_enough_to_prefill():
    """E+P on the encode GPU and D on the datacenter GPU (offload share s = 1): no remote prefill is needed."""
    ClusterSpec(llm_roles=["decode"], local_prefill=True).validate()
    with pytest.raises(ClusterError, match="no LLM worker can prefill"):
        ClusterSpec(llm_roles=["decode"], local_prefill=True, encode_workers=0).validate()
    with pytest.raises(ClusterError, match="no LLM worker can prefill"):  # the second encoder's requests: nowhere
        ClusterSpec(llm_roles=["decode"], encode_workers=2, colocated=[frozenset({"prefill"}), frozenset()]).validate()


def test_cli_reports_bad_roles_without_traceback():
    r = subprocess.run([sys.executable, "-m", "coordinator.cli", "up", "--llm", "prefill"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "decode worker" in r.stdout and "Traceback" not in r.stdout + r.stderr


def test_help_explains_the_commands():
    r = subprocess.run([sys.executable, "-m", "coordinator.cli", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0
    for word in ("up", "demo", "serve", "examples"):
        assert word in r.stdout


def test_cli_refuses_a_model_dir_that_is_not_a_checkpoint(tmp_path):
    r = subprocess.run([sys.executable, "-m", "coordinator.cli", "up", "--model", str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "no config.json" in r.stdout and "Traceback" not in r.stdout + r.stderr


def test_cli_refuses_an_unavailable_transport_with_the_fix(tmp_path):
    """A transport whose package is missing is refused up front, naming the pip command."""
    import os

    blocker = tmp_path / "sitecustomize.py"  # makes the module missing in the child, as on a machine without it
    blocker.write_text("import sys\nsys.modules['nixl_cu12'] = None\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    r = subprocess.run([sys.executable, "-m", "coordinator.cli", "up", "--transport", "nixl"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 2, r.stdout + r.stderr
    said = " ".join(r.stdout.split())  # rich wraps long lines
    assert "--transport nixl" in said and "pip install --no-deps nixl-cu12" in said
    assert "Traceback" not in r.stdout + r.stderr


def test_cli_passes_the_transport_to_every_worker():
    import argparse

    from coordinator.cli import add_cluster_args, spec_from

    p = argparse.ArgumentParser()
    add_cluster_args(p, None)
    assert spec_from(p.parse_args(["--transport", "tcp"])).transport == "tcp"
    assert spec_from(p.parse_args([])).transport == "local"


def test_up_refuses_a_non_loopback_bind_without_an_admin_token(tmp_path):
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("TIERSERVE_ADMIN")}
    r = subprocess.run([sys.executable, "-m", "coordinator.cli", "up", "--host", "0.0.0.0"], capture_output=True,
                       text=True, timeout=60, env=env)
    assert r.returncode == 2 and "TIERSERVE_ADMIN_TOKEN" in r.stdout and "Traceback" not in r.stdout + r.stderr


def test_up_gives_every_worker_it_starts_a_drain_timeout(tmp_path):
    """A plan switch retiring one of the first layout's workers lets it finish what it holds, as it does for
    the workers the switch itself started (their flags come from the executor)."""
    import argparse

    from coordinator.cli import add_cluster_args, spec_from
    from coordinator.launcher import LocalCluster

    p = argparse.ArgumentParser()
    add_cluster_args(p, None)
    assert spec_from(p.parse_args([])).drain_timeout_s == 30.0
    spec = spec_from(p.parse_args(["--drain-timeout-s", "12.5", "--llm", "prefill,decode", "--port", "1",
                                   "--redis-url", "redis://127.0.0.1:1/0"]))  # a URL: no private Redis starts
    cluster = LocalCluster(spec, tmp_path)
    spawned = []
    cluster._spawn = lambda name, argv, device=None: spawned.append((name, argv))  # record instead of starting
    cluster.wait_ready = lambda n, t, report=None: None
    cluster.start()
    workers = [(n, argv) for n, argv in spawned if n != "coordinator"]
    assert {n for n, _ in workers} == {"encode-0", "llm-0-prefill", "llm-1-decode"}
    for name, argv in workers:
        assert argv[argv.index("--drain-timeout-s") + 1] == "12.5", name
    assert "--drain-timeout-s" not in dict(spawned)["coordinator"]


def test_work_conserving_batching_goes_from_up_to_the_coordinators_policy():
    """`tierserve up`'s batching flags reach the coordinator's command line, and the coordinator's flags its
    policy: adaptive work-conserving when nothing is said, pass-through or a holding adaptive only when asked for
    (adaptive alone held each request ~1 s beside an idle encoder at 1 req/s)."""
    import argparse

    from coordinator.cli import add_cluster_args, coordinator_flags
    from coordinator.config import CoordinatorConfig
    from coordinator.serve import add_coordinator_args, config_from_args

    up = argparse.ArgumentParser()
    add_cluster_args(up, None)
    serve = argparse.ArgumentParser()
    add_coordinator_args(serve)

    def policy(up_argv: list[str]):
        flags = coordinator_flags(up.parse_args(up_argv))
        return config_from_args(serve.parse_args(flags), "redis://127.0.0.1:1/0").policy.batch

    assert coordinator_flags(up.parse_args([])) == []  # nothing said: the coordinator's own default
    default = policy([])
    assert (default.name, default.work_conserving) == ("adaptive", True)
    assert CoordinatorConfig().policy.batch == default  # one default, whether built from flags or in code
    holding = policy(["--batch-policy", "adaptive", "--no-work-conserving"])
    assert (holding.name, holding.work_conserving) == ("adaptive", False)
    assert policy(["--batch-policy", "pass_through"]).name == "pass_through"
    flags = coordinator_flags(up.parse_args(["--batch-policy", "fixed_timeout", "--work-conserving"]))
    assert flags == ["--batch-policy", "fixed_timeout", "--work-conserving"]


def test_times_on_the_coordinators_command_line_carry_their_units():
    """--request-timeout, --max-wait and --batch-timeout read a time with its unit and refuse a bare number (they
    read bare seconds before, so an old `--request-timeout 60` stops with the fix rather than meaning 60 ms);
    `tierserve up` passes its --request-timeout on with the unit."""
    import argparse

    from coordinator.cli import add_cluster_args, coordinator_flags
    from coordinator.serve import add_coordinator_args, config_from_args

    serve = argparse.ArgumentParser(exit_on_error=False)
    add_coordinator_args(serve)
    cfg = config_from_args(serve.parse_args(["--request-timeout", "90s", "--max-wait", "250ms",
                                             "--batch-timeout", "20ms"]), "redis://127.0.0.1:1/0")
    assert cfg.request_timeout_s == pytest.approx(90.0)
    assert cfg.policy.batch.max_wait_s == pytest.approx(0.25) and cfg.policy.batch.timeout_s == pytest.approx(0.02)
    default = config_from_args(serve.parse_args([]), "redis://127.0.0.1:1/0")
    assert default.request_timeout_s == 120.0 and default.policy.batch.max_wait_s == 1.0
    for flag in ("--request-timeout", "--max-wait", "--batch-timeout"):
        with pytest.raises(argparse.ArgumentError, match=r"has no unit; write a number with a unit .*e\.g\. 60s"):
            serve.parse_args([flag, "60"])
    up = argparse.ArgumentParser()
    add_cluster_args(up, None)
    flags = coordinator_flags(up.parse_args(["--request-timeout", "1.5min"]))
    assert flags == ["--request-timeout", "90.0s"]
    assert config_from_args(serve.parse_args(flags), "redis://127.0.0.1:1/0").request_timeout_s == pytest.approx(90.0)


def test_serve_refuses_a_bare_request_timeout_with_the_fix():
    r = subprocess.run([sys.executable, "-m", "coordinator.serve", "--request-timeout", "60"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "--request-timeout='60' has no unit" in r.stderr and "60s" in r.stderr
