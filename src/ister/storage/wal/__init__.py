"""storage/wal: per-topic write-ahead log with group commit (see docs/formats.md for the file layout)."""

from .config import WalConfig
from .locks import hold_root
from .pool import WriterPool
from .reader import WalReader
from .wal import Wal

__all__ = ["Wal", "WalConfig", "WalReader", "WriterPool", "hold_root"]
