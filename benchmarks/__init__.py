"""Speed and memory benchmarks of lbjax (run on demand from the repo root: `python -m benchmarks.<name>`).

Not part of the test run. Each script prints its table and rewrites its own section of
benchmarks/README.md; figures are ratios against a baseline measured in the same process.
"""
