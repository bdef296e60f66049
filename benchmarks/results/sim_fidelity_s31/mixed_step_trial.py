"""Trial, not a model: sim_fidelity re-run (judged as usual, speed and noise read again) with every engine step that
prefills beside running decodes made SAVING_MS shorter (at the profile's scale, times the prefill's slowdown), in the
timing and in the compute the workers' timers would report. Replaces one method of this process's simulator.

    python benchmarks/results/sim_fidelity_s31/mixed_step_trial.py SAVING_MS -- <sim_fidelity arguments>
"""

from __future__ import annotations

import sys

from coordinator.planner import sim_llm


def install(saving_s: float) -> None:
    model = sim_llm.Engine._prefill_s

    def _prefill_s(self, plan, svc=None):
        out = model(self, plan, svc)
        if plan.decodes and saving_s:
            s = svc or self.cluster.service
            factor = s.slowdown if s.prefill_slowdown is None else s.prefill_slowdown
            out = max(0.5 * out, out - saving_s * factor)
        return out

    sim_llm.Engine._prefill_s = _prefill_s


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[2] != "--":
        sys.exit(__doc__)
    install(float(sys.argv[1]) * 1e-3)
    from benchmarks.sim_fidelity import main
    sys.exit(main(sys.argv[3:]))
