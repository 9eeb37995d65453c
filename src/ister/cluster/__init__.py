"""Cluster mode runtime: membership, leader election, assignment, ownership fencing (on etcd)."""
