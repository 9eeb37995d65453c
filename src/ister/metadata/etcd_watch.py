"""The etcd store's watches (etcd.py): one etcd watch stream per `Watch`, fed until either ends."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aetcd
import grpc
import grpc.aio
from aetcd import rpc

from ister.errors import MetadataError, WatchLagged
from ister.metadata.etcd_base import CONNECTION_CODES, EtcdBase, range_end
from ister.metadata.etcd_channel import (
    Connection,
    describe_error,
)
from ister.metadata.store import (
    DEFAULT_WATCH_QUEUE,
    Watch,
    WatchEvent,
    check_key,
    decode_value,
)

log = logging.getLogger(__name__)


class EtcdWatches(EtcdBase):
    def watch(self, prefix: str, *, max_queue: int = DEFAULT_WATCH_QUEUE) -> Watch:
        self._current()
        check_key(prefix, "prefix")
        watch = Watch(prefix, max_queue, on_close=self._watch_closed)
        start_revision = self._seen_revision + 1  # every change this client could not have seen yet
        task = self._tasks.spawn(self._follow(watch, start_revision), f"etcd-watch {prefix}")
        self._watches[watch] = task
        return watch

    def _watch_closed(self, watch: Watch) -> None:
        task = self._watches.pop(watch, None)
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    async def _follow(self, watch: Watch, start_revision: int) -> None:
        """Feed one etcd watch stream into `watch` until either ends."""
        conn: Connection | None = None
        call: Any = None
        key = self._key(watch.prefix)
        try:
            conn = self._current()
            call = conn.watch.Watch()
            create = rpc.WatchCreateRequest(key=key, range_end=range_end(key), start_revision=start_revision)
            async with asyncio.timeout(self._timeout):
                await call.write(rpc.WatchRequest(create_request=create))
                response = await call.read()
                if response is grpc.aio.EOF or not response.created:
                    raise MetadataError(f"etcd did not create the watch on {watch.prefix!r}")
            while not watch.closed:
                if response is grpc.aio.EOF:
                    raise MetadataError(f"etcd closed the watch stream on {watch.prefix!r}")
                self._observe(response.header)
                if response.compact_revision:
                    raise WatchLagged(
                        f"etcd compacted revision {start_revision}..{response.compact_revision} before the "
                        f"watch on {watch.prefix!r} could read it; re-list and watch again"
                    )
                if response.canceled:
                    reason = response.cancel_reason or "no reason given"
                    raise MetadataError(f"etcd cancelled the watch on {watch.prefix!r}: {reason}")
                for event in response.events:
                    watch.feed(self._event(event))
                response = await call.read()
        except MetadataError as exc:
            watch.fail(exc)
        except grpc.aio.AioRpcError as exc:
            where = conn.endpoint if conn is not None else "etcd"
            watch.fail(
                MetadataError(f"etcd watch on {watch.prefix!r} at {where} failed: {describe_error(exc)}")
            )
            if conn is not None and exc.code() in CONNECTION_CODES:
                self._maybe_failover(conn)
        except TimeoutError:
            watch.fail(
                MetadataError(f"etcd did not confirm the watch on {watch.prefix!r} in {self._timeout} s")
            )
        except (grpc.aio.UsageError, aetcd.ClientError, OSError) as exc:
            watch.fail(MetadataError(f"etcd watch on {watch.prefix!r} failed: {describe_error(exc)}"))
        finally:
            if call is not None:
                call.cancel()
            self._watches.pop(watch, None)

    def _event(self, event: Any) -> WatchEvent:
        key = self._user_key(event.kv.key)
        revision = int(event.kv.mod_revision)
        if event.type == rpc.Event.PUT:
            return WatchEvent("put", key, decode_value(event.kv.value, key), revision)
        return WatchEvent("delete", key, None, revision)
