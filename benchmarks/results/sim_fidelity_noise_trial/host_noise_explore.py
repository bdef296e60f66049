"""Exploration: a time-correlated host-speed factor on the simulator's stage times, judged offline."""
import math, os, random, sys, json
import coordinator.planner.sim as S
import benchmarks.sim_fidelity_layouts as L

SIGMA = float(os.environ.get("HN_SIGMA", "0.15")); PERIOD = float(os.environ.get("HN_PERIOD_S", "0.05"))
HOPS = os.environ.get("HN_HOPS", "1") == "1"

class HostNoise:
    def __init__(self, inner, seed=1):
        self.inner, self.clock, self.rng, self.cache = inner, (lambda: 0.0), random.Random(seed), {}
    def factor(self):
        k = int(self.clock() / PERIOD)
        f = self.cache.get(k)
        if f is None:
            f = self.cache[k] = math.exp(self.rng.gauss(0.0, SIGMA))
        return f
    def encode_s(self, *a): return self.inner.encode_s(*a) * self.factor()
    def prefill_s(self, *a): return self.inner.prefill_s(*a) * self.factor()
    def decode_step_s(self, *a): return self.inner.decode_step_s(*a) * self.factor()
    def under_load(self, *a):
        return HostNoise(self.inner.under_load(*a))
    def __getattr__(self, name): return getattr(self.inner, name)

_Cluster = S.Cluster
class NoisyCluster(_Cluster):
    def __init__(self, deployment, service, *a, **k):
        super().__init__(deployment, service, *a, **k)
        if isinstance(service, HostNoise):
            service.clock = lambda: self.events.now
S.Cluster = NoisyCluster
_Sim = S.Simulator
class NoisySim(_Sim):
    def __init__(self, deployment, service, **k):
        super().__init__(deployment, HostNoise(service), **k)
L.Simulator = NoisySim
from benchmarks.sim_fidelity import main
sys.exit(main(sys.argv[1:]))
