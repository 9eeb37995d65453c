"""Replicated reliable topics: the leader and follower sides (docs/replication.md)."""
