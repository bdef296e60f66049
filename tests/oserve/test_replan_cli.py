"""`tierserve replan`: its flags and its refusals (a live loop runs in the live plan-switch setting)."""

from __future__ import annotations

from coordinator.cli import main
from coordinator.redis_server import free_port


def test_bad_band_and_unreachable_cluster_are_messages_and_exit_2(capsys):
    assert main(["replan", "--pool", "2xRTX4090", "--band", "0.9,0.5"]) == 2
    assert "low < high" in capsys.readouterr().out
    assert main(["replan", "--pool", "2xRTX4090", "--url", f"http://127.0.0.1:{free_port()}", "--dry-run"]) == 2
    assert "error:" in capsys.readouterr().out
