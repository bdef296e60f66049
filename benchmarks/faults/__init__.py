"""Fault injection under load: a steady stream of image requests whose answers are checked against known
ones, real faults (kill -9, SIGSTOP, Redis restart, FLUSHALL) on a local cluster, and the outcome counts.
Used by the fault tests (tests/integration/test_faults.py) and the soak benchmark (benchmarks/soak.py)."""
