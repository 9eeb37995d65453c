"""Real Ister clusters on one machine: etcd, SeaweedFS (S3) and `ister broker` processes.

One implementation for everything that starts them: `ister dev` (cli/dev.py), the integration tests'
harness (tests/integration/harness.py, cluster.py) and the benchmarks (ister.benchmark). The compose file
(deploy/compose.yaml) is generated from the same service specifications (`spec.py`, `compose.py`).
"""
