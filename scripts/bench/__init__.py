"""The benchmarks: each prints ratios measured side by side in one run (docs/performance.md lists them with their
commands); `harness` is what they share (one process per pipeline, timed in turns, the memory check)."""
