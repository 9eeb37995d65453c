"""The WAL's settings, defined once in `ister.wal_settings` (which the broker's configuration embeds)."""

from ister.wal_settings import MAX_THREADS, WalConfig, WalSettings, check_pool_settings

__all__ = ["MAX_THREADS", "WalConfig", "WalSettings", "check_pool_settings"]
