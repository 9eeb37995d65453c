"""storage/wal."""
