"""A WAL's segment files as the loop sees them: listing, dropping the oldest (retention), verifying, holes."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from .durable import fsync_dir
from .holes import Hole
from .reader import verify_segment
from .walstate import WalState


class WalFiles(WalState):
    __slots__ = ()

    def holes(self) -> list[tuple[int, int]]:
        """(first, end) offset ranges, end exclusive, that the local WAL cannot serve although they are at
        or above its first offset: lost at open (below the high-water mark) or damaged in a segment file.
        Readers skip them (a TieredReader reads them from the durable tier when it holds them)."""
        return self.damage.ranges()

    def hole_at(self, offset: int) -> Hole | None:
        return self.damage.find(offset) if self.damage else None

    async def verify_segment(self, first_offset: int) -> list[Hole]:
        """Read every committed frame of the segment that starts at `first_offset` (CRC checked), recording
        each damaged range found in `damage` (logged and counted once); returns the new ones."""
        seg = next((s for s in self.segments_snapshot() if s.first_offset == first_offset), None)
        if seg is None or self._cutting:
            return []
        gen = self._cut_gen
        return await verify_segment(seg, self._committed, self.damage, lambda: self._cut_gen == gen)

    @property
    def active_bytes(self) -> int:
        """Bytes in the active (last) segment file."""
        with self._segments_lock:
            return self._segments[-1].size

    @property
    def segment_count(self) -> int:
        with self._segments_lock:
            return len(self._segments)

    def segments(self) -> list[tuple[int, Path, int]]:
        """(first_offset, path, size in bytes) of every segment file, oldest first; the last is active."""
        return [(s.first_offset, s.path, s.size) for s in self.segments_snapshot()]

    def record_ranges(self) -> list[tuple[int, int]]:
        """[first, end) offsets of the records each non-empty segment file holds, oldest first."""
        return [
            (s.first_offset, s.end_offset) for s in self.segments_snapshot() if s.end_offset > s.first_offset
        ]

    async def drop_segments(self, paths: Sequence[Path]) -> int:
        """Delete closed segment files from the oldest end (the durable tier holds their records).

        Only a leading run of closed segments is dropped (never the active one, never a gap in the middle);
        the WAL's first offset moves to the first remaining segment. Readers below it get OffsetOutOfRange
        (the tiered reader then reads from objects). Returns how many files were deleted.
        """
        if self._cutting:
            return 0  # the cut decides which files stay; retention asks again later
        wanted = {Path(p) for p in paths}
        with self._segments_lock:
            drop = []
            for seg in self._segments[:-1]:
                if seg.path not in wanted:
                    break
                drop.append(seg)
            if not drop:
                return 0
            del self._segments[: len(drop)]
            self._first_offset = self._segments[0].first_offset
        self.damage.prune(self._first_offset)
        await asyncio.to_thread(_unlink_all, [s.path for s in drop], self._directory)
        return len(drop)

    async def drop_below(self, start: int) -> int:
        """Delete the closed segment files wholly below `start` (retention moved the topic's start offset
        past them); returns how many."""
        segments = self.segments()
        paths = [segments[i][1] for i in range(len(segments) - 1) if segments[i + 1][0] <= start]
        return await self.drop_segments(paths) if paths else 0


def _unlink_all(paths: list[Path], directory: Path) -> None:
    for path in paths:
        path.unlink(missing_ok=True)
    fsync_dir(directory)
