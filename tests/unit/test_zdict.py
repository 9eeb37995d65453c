"""zstd dictionaries for per-record compression (ister.core.zdict and their use in ister.core.compression)."""

from __future__ import annotations

import pytest

from ister.benchmark.payloads import log_lines
from ister.core import zdict
from ister.core.compression import (
    ENVELOPE_SIZE,
    Codec,
    CompressionError,
    decompress,
    plain,
    unwrap,
    uses_dictionary,
    wrap,
    wrap_with_dictionary,
)
from ister.core.zdict import DictionaryError, DictionaryRegistry

SAMPLES = log_lines(500)
LINES = log_lines(300, seed=11)  # records the dictionary never saw


@pytest.fixture(scope="module")
def trained() -> bytes:
    return zdict.train(SAMPLES, 123_456)


def registry(*dicts: bytes) -> DictionaryRegistry:
    r = DictionaryRegistry()
    for d in dicts:
        r.add(d)
    return r


def test_a_trained_dictionary_carries_its_id_and_size(trained: bytes) -> None:
    assert zdict.load_id(trained) == 123_456
    assert len(trained) <= zdict.DICT_SIZE
    assert registry(trained).ids() == [123_456]


def test_frames_name_their_dictionary_and_plain_frames_none(trained: bytes) -> None:
    r = registry(trained)
    stored = wrap_with_dictionary(123_456, LINES[0], r)
    assert zdict.dict_id_of(stored[ENVELOPE_SIZE:]) == 123_456
    assert uses_dictionary(stored)
    plain_zstd = wrap(Codec.ZSTD, LINES[0])
    assert zdict.dict_id_of(plain_zstd[ENVELOPE_SIZE:]) == 0
    assert not uses_dictionary(plain_zstd) and not uses_dictionary(wrap(Codec.LZ4, LINES[0]))
    assert not uses_dictionary(LINES[0])
    with pytest.raises(ValueError, match="not a zstd frame"):
        zdict.dict_id_of(b"\x00" * 10)


def test_round_trip_through_the_registry(trained: bytes) -> None:
    r = registry(trained)
    for line in LINES:
        stored = wrap_with_dictionary(123_456, line, r)
        assert decompress(Codec.ZSTD, stored[ENVELOPE_SIZE:], len(line), r) == line


def test_the_process_registry_is_what_readers_use(trained: bytes) -> None:
    zdict.REGISTRY.add(trained)
    stored = wrap_with_dictionary(123_456, LINES[1])
    assert plain(stored) == LINES[1] and unwrap(stored) == LINES[1]


def test_ratio_on_log_lines_beats_plain_zstd_twice(trained: bytes) -> None:
    r = registry(trained)
    size = sum(map(len, LINES))
    with_dict = size / sum(len(wrap_with_dictionary(123_456, line, r)) for line in LINES)
    without = size / sum(len(wrap(Codec.ZSTD, line)) for line in LINES)
    assert without < 2.0
    assert with_dict > 3.0, (with_dict, without)  # measured 3.5 (docs/benchmarks.md)


def test_an_unknown_dictionary_is_a_clear_error(trained: bytes) -> None:
    stored = wrap_with_dictionary(123_456, LINES[2], registry(trained))
    with pytest.raises(CompressionError, match="needs dictionary 123456, which is not loaded"):
        decompress(Codec.ZSTD, stored[ENVELOPE_SIZE:], len(LINES[2]), DictionaryRegistry())


def test_the_wrong_dictionary_under_the_id_cannot_be_loaded_and_a_damaged_frame_is_refused(
    trained: bytes,
) -> None:
    r = registry(trained)
    other = zdict.train(log_lines(500, seed=3), 123_456)
    r.add(trained)  # the same bytes again: a no-op
    with pytest.raises(DictionaryError, match="other bytes"):
        r.add(other)
    stored = bytearray(wrap_with_dictionary(123_456, LINES[3], r))
    for pos in (ENVELOPE_SIZE + 6, len(stored) // 2, len(stored) - 2):  # the dict id, the data, the checksum
        bad = bytearray(stored)
        bad[pos] ^= 0xFF
        with pytest.raises(CompressionError):
            decompress(Codec.ZSTD, bytes(bad[ENVELOPE_SIZE:]), len(LINES[3]), r)
    with pytest.raises(CompressionError):  # truncated
        decompress(Codec.ZSTD, bytes(stored[ENVELOPE_SIZE:-5]), len(LINES[3]), r)


def test_training_needs_enough_samples_and_a_valid_id() -> None:
    with pytest.raises(DictionaryError, match="at least"):
        zdict.train(SAMPLES[:10], 123_456)
    with pytest.raises(DictionaryError, match="outside"):
        zdict.train(SAMPLES, 5)
    assert zdict.FIRST_ID <= zdict.new_id() <= zdict.LAST_ID


def test_bytes_that_are_no_dictionary_are_refused() -> None:
    with pytest.raises(DictionaryError, match="not a zstd dictionary"):
        DictionaryRegistry().add(b"hello world, not a dictionary")
    with pytest.raises(DictionaryError, match="without an id"):
        zdict.load_id(b"\x37\xa4\x30\xec\x00\x00\x00\x00rest")
    with pytest.raises(DictionaryError, match="does not load"):
        DictionaryRegistry().add(b"\x37\xa4\x30\xec\x01\x00\x01\x00" + b"\x00" * 20)
    with pytest.raises(DictionaryError, match="no zstd dictionary 7"):
        DictionaryRegistry().compressor(7)
