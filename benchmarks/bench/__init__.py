"""`tierserve bench`: the cost-per-goodput benchmark of OpenAI-compatible multimodal chat servers.

Modules, in the order a run uses them: args/cli (command line), workload + media + dataset (what is
sent and when), targets + presets (what is measured and how it is configured), client (one timed
streaming request), sweep (every system x rate cell), slo + summary + cost (judging), report + plots
(outputs). Nothing outside benchmarks imports this package (DESIGN: dependency direction).
"""
