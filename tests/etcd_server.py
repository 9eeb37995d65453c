"""The test etcd: `ister.benchmark.etcd` (benchmarks start the same server)."""

from ister.benchmark.etcd import START_SECONDS, EtcdServer, EtcdServerTls, etcd_binary

__all__ = ["START_SECONDS", "EtcdServer", "EtcdServerTls", "etcd_binary"]
