"""zstd dictionaries for records compressed one at a time (docs/compression.md, "Dictionaries").

A 1 KiB record compressed on its own finds little to refer back to; a dictionary trained on a topic's own
records gives it the repeated keys and values up front, so each record keeps its own frame (and offset)
and still compresses almost as well as a block of them.

A zstd frame made with a dictionary names it in its header (the Dict_ID field; 0 or absent = none), so a
stored record needs no new envelope: it stays `0xC1 | zstd | size | frame`, and a reader looks the frame's
dictionary id up in a `DictionaryRegistry`. Dictionaries are immutable: an id always means the same bytes
(the registry refuses a second dictionary under a known id). The process-wide `REGISTRY` is what
`core.compression` decompresses with; the broker fills it from the metadata store
(broker/compression_dicts.py), a worker process from what its operation carries.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Sequence

import zstandard

from ister.errors import InvalidArgument

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
DICT_SIZE = 16 * 1024  # trained dictionary: 3.5x on 1 KiB JSON log lines (32 and 64 KiB did no better)
MIN_SAMPLES = 64  # zstd's trainer needs enough samples to find anything; fewer is refused
# Ids the trainer is given: zstd reserves 0..32767 for registered dictionaries and ids above 2^31 - 1.
FIRST_ID, LAST_ID = 32_768, 2**31 - 1
LEVEL = 3  # as core.compression's plain zstd


class DictionaryError(InvalidArgument):
    """A dictionary that cannot be trained or loaded (too few samples, not a zstd dictionary, an id that
    already names other bytes)."""


def new_id() -> int:
    """A random dictionary id (one that names a stored dictionary already is caught by create-if-absent)."""
    return FIRST_ID + secrets.randbelow(LAST_ID - FIRST_ID + 1)


def train(samples: Sequence[bytes], dict_id: int, size: int = DICT_SIZE) -> bytes:
    """A zstd dictionary of at most `size` bytes trained on `samples` (plain records), with id `dict_id`."""
    if len(samples) < MIN_SAMPLES:
        raise DictionaryError(f"{len(samples)} samples; a dictionary needs at least {MIN_SAMPLES}")
    if not FIRST_ID <= dict_id <= LAST_ID:
        raise DictionaryError(f"dictionary id {dict_id} is outside {FIRST_ID}..{LAST_ID}")
    try:
        d = zstandard.train_dictionary(size, list(samples), dict_id=dict_id, level=LEVEL)
    except zstandard.ZstdError as exc:
        raise DictionaryError(f"zstd could not train a dictionary: {exc}") from None
    return bytes(d.as_bytes())


def dict_id_of(data: bytes | memoryview) -> int:
    """The dictionary id a zstd frame's header names (0: none). Checks the frame descriptor's flag first
    (one byte), so a frame without a dictionary costs no parsing. ValueError when it is no zstd frame."""
    if len(data) < 5 or bytes(data[:4]) != ZSTD_MAGIC:
        raise ValueError("not a zstd frame")
    if not data[4] & 0x03:  # Dictionary_ID_flag: 0 = the field is absent
        return 0
    try:
        return int(zstandard.get_frame_parameters(data).dict_id)
    except zstandard.ZstdError as exc:
        raise ValueError(f"damaged zstd frame header: {exc}") from None


def load_id(data: bytes) -> int:
    """The id of a serialized dictionary (DictionaryError when it is not a zstd dictionary with an id)."""
    if len(data) < 8 or data[:4] != b"\x37\xa4\x30\xec":  # a full dictionary's magic
        raise DictionaryError("not a zstd dictionary")
    dict_id = int.from_bytes(data[4:8], "little")
    if dict_id == 0:
        raise DictionaryError("a zstd dictionary without an id")
    return dict_id


class _Local(threading.local):
    def __init__(self) -> None:
        self.compressors: dict[int, zstandard.ZstdCompressor] = {}
        self.decompressors: dict[int, zstandard.ZstdDecompressor] = {}


class DictionaryRegistry:
    """Dictionary id -> dictionary, and per thread one compression and decompression context each (a
    context digests its dictionary once; making one per record would cost more than the record)."""

    def __init__(self) -> None:
        self._dicts: dict[int, bytes] = {}
        self._parsed: dict[int, zstandard.ZstdCompressionDict] = {}
        self._lock = threading.Lock()
        self._local = _Local()

    def add(self, data: bytes) -> int:
        """Load a serialized dictionary; its id. Adding the same bytes again is a no-op; other bytes under
        a known id are refused (an id names one dictionary forever)."""
        dict_id = load_id(data)
        with self._lock:
            known = self._dicts.get(dict_id)
            if known is not None:
                if known != data:
                    raise DictionaryError(f"dictionary {dict_id} is already loaded with other bytes")
                return dict_id
            try:
                parsed = zstandard.ZstdCompressionDict(data, dict_type=zstandard.DICT_TYPE_FULLDICT)
                parsed.precompute_compress(level=LEVEL)
            except zstandard.ZstdError as exc:
                raise DictionaryError(f"dictionary {dict_id} does not load: {exc}") from None
            self._parsed[dict_id] = parsed
            self._dicts[dict_id] = bytes(data)
        return dict_id

    def __contains__(self, dict_id: int) -> bool:
        return dict_id in self._dicts

    def get(self, dict_id: int) -> bytes | None:
        return self._dicts.get(dict_id)

    def ids(self) -> list[int]:
        return sorted(self._dicts)

    def compressor(self, dict_id: int) -> zstandard.ZstdCompressor:
        c = self._local.compressors.get(dict_id)
        if c is None:
            parsed = self._parsed.get(dict_id)
            if parsed is None:
                raise DictionaryError(f"no zstd dictionary {dict_id} is loaded")
            c = zstandard.ZstdCompressor(level=LEVEL, dict_data=parsed, write_content_size=True)
            self._local.compressors[dict_id] = c
        return c

    def decompressor(self, dict_id: int) -> zstandard.ZstdDecompressor | None:
        d = self._local.decompressors.get(dict_id)
        if d is None:
            parsed = self._parsed.get(dict_id)
            if parsed is None:
                return None
            d = zstandard.ZstdDecompressor(dict_data=parsed)
            self._local.decompressors[dict_id] = d
        return d


REGISTRY = DictionaryRegistry()  # this process's dictionaries (filled by the broker or a worker's operation)
