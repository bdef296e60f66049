"""The planner: GPU-tier catalog, performance model, discrete-event simulator and HAS search."""
