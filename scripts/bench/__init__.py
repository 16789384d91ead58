"""The benchmarks: each prints ratios measured side by side in one run (docs/performance.md lists them with their
commands); `harness` is what they share (one process per pipeline, timed in turns, the memory check); `suite` is a
pytest plugin and report of where the test suite's time goes."""
