"""The test etcd: `ister.devcluster.etcd` (benchmarks and `ister dev` start the same server)."""

from ister.devcluster.etcd import START_SECONDS, EtcdServer, EtcdServerTls, etcd_binary

__all__ = ["START_SECONDS", "EtcdServer", "EtcdServerTls", "etcd_binary"]
