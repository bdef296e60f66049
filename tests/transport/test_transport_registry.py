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
