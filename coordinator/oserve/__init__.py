"""OServe: watch the workload, forecast it, re-plan, and switch deployments live.

- `monitor`: per-second workload counters in Redis (bounded retention), read back over a window;
- `forecast`: pure forecasters (last value, EWMA, Holt / Holt-Winters, ARIMA) with an injected clock;
- `replanner`: a pure decision object (band, hysteresis, minimum dwell) over a capacity model;
- `layout` + `switch`: the diff between two plans' worker layouts and the state machine that applies it
  through an `Executor` (`local_executor`: processes under `tierserve up`'s supervisor).
"""
