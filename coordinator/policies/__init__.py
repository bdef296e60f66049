"""Scheduling policies: pure objects with an injected clock, shared by the runtime and the simulator."""
