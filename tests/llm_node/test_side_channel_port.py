"""vLLM P/D workers' NIXL side channel gets a port below the ephemeral range, free when chosen."""

from __future__ import annotations

import socket

from llm_node.vllm_pd import SIDE_CHANNEL_PORTS, side_channel_port


def test_the_port_is_outside_the_ephemeral_range_and_bindable():
    for _ in range(5):
        port = side_channel_port("127.0.0.1")
        assert port in SIDE_CHANNEL_PORTS
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_port_in_use_is_not_chosen(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        busy = taken.getsockname()[1]
        taken.listen()
        monkeypatch.setattr("llm_node.vllm_pd.SIDE_CHANNEL_PORTS", range(busy, busy + 1))
        port = side_channel_port("127.0.0.1", tries=1)
    assert port != busy
