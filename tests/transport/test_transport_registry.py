import asyncio
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from transport.base import TransportError
from transport.local import LocalReceiver, LocalSender
from transport.registry import default_local_address, make_receiver, make_sender, unavailable


@pytest.fixture
def short_dir():
    d = tempfile.mkdtemp(prefix="ts-", dir="/tmp")
    yield Path(d)
    shutil.rmtree(d)


def test_unknown_kind_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown transport 'rdma'; known: \['local', 'nixl', 'tcp', 'ucx'\]"):
        make_sender("rdma")
    with pytest.raises(ValueError, match="unknown transport 'rdma'"):
        make_receiver("rdma", "w1")


@pytest.mark.parametrize(("kind", "module", "command"), [
    ("ucx", "ucxx", "pip install ucxx-cu12"), ("nixl", "nixl_cu12", "pip install --no-deps nixl-cu12==1.5.1")])
def test_a_missing_package_is_named_with_its_pip_command(kind, module, command, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == module else real(name, *a))
    assert unavailable(kind) == f"the {kind} transport needs the {module} module: {command}"
    with pytest.raises(TransportError, match=rf"{re.escape(command)}; or choose transport 'tcp'"):
        make_sender(kind)
    with pytest.raises(TransportError, match=re.escape(command)):
        make_receiver(kind, "w1")


def test_the_cpu_backends_need_nothing_extra():
    assert unavailable("local") is None and unavailable("tcp") is None


def test_local_receiver_defaults_to_a_socket_per_worker(short_dir):
    r = make_receiver("local", "llm-0", runtime_dir=short_dir / "run", ttl=5.0)
    assert isinstance(r, LocalReceiver) and r.ttl == 5.0
    assert r.address == f"unix://{short_dir}/run/llm-0.sock"
    assert (short_dir / "run").stat().st_mode & 0o777 == 0o700


def test_default_runtime_dir_is_private_under_tmpdir(short_dir, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(short_dir))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() caches its first answer
    assert default_local_address("w1") == f"unix://{short_dir}/tierserve-{os.getuid()}/w1.sock"


@pytest.mark.parametrize("worker_id", ["", "../etc/x", "a/b", ".hidden"])
def test_worker_ids_that_cannot_name_a_file_are_refused(worker_id, short_dir):
    with pytest.raises(ValueError, match="cannot name a socket file"):
        default_local_address(worker_id, short_dir)


async def test_registry_built_pair_moves_a_tensor(short_dir):
    sender = make_sender("local", timeout=5.0)
    assert isinstance(sender, LocalSender) and sender.timeout == 5.0
    for receiver in (make_receiver("local", "w1", runtime_dir=short_dir), make_receiver("local", "w2", tcp=True)):
        await receiver.start()
        try:
            async with asyncio.timeout(10):
                descs = await sender.send(receiver.address, "r1", {"x": torch.arange(4)})
                assert torch.equal((await receiver.recv(descs, timeout=1))["x"], torch.arange(4))
        finally:
            await receiver.close()
    await sender.close()
    assert receiver.address.startswith("tcp://127.0.0.1:")
    assert not list(short_dir.iterdir())


async def test_the_worker_config_tells_the_tcp_receiver_which_address_to_bind_and_publish():
    import argparse

    from coordinator.protocol.worker_config import WorkerConfig, add_worker_args, worker_fields

    p = argparse.ArgumentParser()
    add_worker_args(p)
    cfg = WorkerConfig(**worker_fields(p.parse_args(["--worker-id", "w1", "--transport", "tcp",
                                                     "--transport-host", "127.0.0.2"])))
    assert cfg.receiver_options()["host"] == "127.0.0.2"
    assert "host" not in WorkerConfig(worker_id="w2", transport="ucx", transport_host="10.0.0.1").receiver_options()
    assert "host" not in WorkerConfig(worker_id="w3", transport="tcp").receiver_options()  # 127.0.0.1, as before
    receiver = make_receiver(cfg.transport, cfg.worker_id, **cfg.receiver_options())
    await receiver.start()
    sender = make_sender("tcp", timeout=5.0)
    try:
        assert receiver.address.startswith("tcp://127.0.0.2:")
        async with asyncio.timeout(10):
            descs = await sender.send(receiver.address, "r1", {"x": torch.arange(4)})
            assert torch.equal((await receiver.recv(descs, timeout=1))["x"], torch.arange(4))
    finally:
        await sender.close()
        await receiver.close()


async def test_the_worker_config_carries_the_cluster_secret_and_caps_from_the_environment(monkeypatch):
    """The launcher passes the secret and the Redis URL in the environment (never on the command line); the
    flags set the receiver's caps; both ends built from the config authenticate each other."""
    import argparse

    from coordinator.protocol.worker_config import WorkerConfig, add_worker_args, worker_fields

    p = argparse.ArgumentParser()
    add_worker_args(p)
    argv = ["--worker-id", "w1", "--transport", "tcp", "--transport-max-unclaimed-mib", "2",
            "--transport-unclaimed-ttl-s", "5"]
    monkeypatch.delenv("TIERSERVE_CLUSTER_SECRET", raising=False)
    monkeypatch.delenv("TIERSERVE_CLUSTER_SECRET_FILE", raising=False)
    assert WorkerConfig(**worker_fields(p.parse_args(argv))).sender_options() == {}
    monkeypatch.setenv("TIERSERVE_CLUSTER_SECRET", "s3cret")
    monkeypatch.setenv("TIERSERVE_REDIS_URL", "redis://:pw@10.0.0.9:6379/2")
    cfg = WorkerConfig(**worker_fields(p.parse_args(argv)))  # read at parse time, not at import
    assert cfg.redis_url == "redis://:pw@10.0.0.9:6379/2" and "s3cret" not in repr(cfg)
    assert cfg.sender_options() == {"secret": b"s3cret"}
    assert cfg.receiver_options() == {"secret": b"s3cret", "max_unclaimed_bytes": 2 << 20,
                                      "max_request_bytes": 512 << 20, "ttl": 5.0}
    receiver = make_receiver(cfg.transport, cfg.worker_id, **cfg.receiver_options())
    await receiver.start()
    sender, stranger = make_sender("tcp", timeout=5.0, **cfg.sender_options()), make_sender("tcp", timeout=5.0)
    try:
        async with asyncio.timeout(10):
            with pytest.raises(TransportError, match="no authentication tag"):
                await stranger.send(receiver.address, "r1", {"x": torch.arange(4)})
            with pytest.raises(TransportError, match="max_unclaimed_bytes=2097152"):
                await sender.send(receiver.address, "big", {"x": torch.zeros(1 << 20)})
            descs = await sender.send(receiver.address, "r1", {"x": torch.arange(4)})
            assert torch.equal((await receiver.recv(descs, timeout=1))["x"], torch.arange(4))
            assert receiver.stats().refused_bad_mac == 1 and receiver.stats().refused_over_cap == 1
    finally:
        await sender.close()
        await stranger.close()
        await receiver.close()


def test_loading_both_ucx_libraries_in_one_process_warns():
    """ucxx and NIXL each bring a UCX; together in one process NIXL slows ~8x, so the registry says so."""
    import subprocess
    import sys

    for kind in ("ucx", "nixl"):
        if (why := unavailable(kind)) is not None:
            pytest.skip(why)
    code = ("import logging; logging.basicConfig(level=logging.WARNING);"
            "from transport import registry; registry._load('ucx', 'sender');"
            "print('one', flush=True); registry._load('nixl', 'sender')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "one" in out.stdout
    assert "both loaded in this process" in out.stderr and "own process" in out.stderr
