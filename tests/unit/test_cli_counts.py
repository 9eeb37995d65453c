"""Counts in CLI output read as English: "1 message", "2 messages" (never "1 messages" or "1 files")."""

from __future__ import annotations

from typing import Any

import ister.cli.main  # noqa: F401  (loads the CLI's modules in their order: cli.stats alone is circular)
from ister.cli.admin_cluster import health_line
from ister.cli.stats import _storage_line, _topic_fields
from ister.cli.table_drop import dropped_line
from ister.ids import counted
from ister.wire.gen import ister_v1_pb2 as pb


def test_counted_is_singular_for_one_only() -> None:
    assert [counted(n, "message") for n in (0, 1, 2)] == ["0 messages", "1 message", "2 messages"]
    assert counted(1_234, "file") == "1234 files"


def test_topic_stats_counts() -> None:
    storage = pb.StorageStats(wal_segments=1, objects=1, parquet_files=1)
    line = _storage_line(storage)
    assert "in 1 segment," in line and "in 1 object," in line and "in 1 file)" in line, line
    fields = dict(
        _topic_fields(pb.TopicStats(topic="/default/t", end_offset=1, message_count=1, storage=storage))
    )
    assert fields["Offsets"] == "start 0, end 1 (1 message)"
    storage = pb.StorageStats(wal_segments=2, objects=0, parquet_files=3)
    line = _storage_line(storage)
    assert "in 2 segments," in line and "in 0 objects," in line and "in 3 files)" in line, line


def test_drop_table_counts() -> None:
    assert (
        dropped_line("default.t", 1, 1, "its files deleted")
        == "dropped default.t (1 row, 1 file; its files deleted)"
    )
    assert dropped_line("default.t", 5, None, "kept") == "dropped default.t (5 rows, ? files; kept)"


def test_cluster_health_counts() -> None:
    h: dict[str, Any] = {"under_replicated": [{}], "under_min_isr": [], "replicated_topics": 1}
    h |= {"failed_moves": [{}], "moves_total": 2}
    assert health_line(h) == (
        "cluster: 1 under-replicated and 0 under-min-ISR of 1 replicated topic, 1 failed move, "
        "2 rebalancing moves kept"
    )
