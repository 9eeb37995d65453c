"""`ister admin topics describe` shows the topic's zstd dictionary beside its codec, as `topics compression`
does (docs/compression.md): its id once trained, "sampling" (JSON null) until then; it used to show the
codec only."""

from __future__ import annotations

import importlib
import json
from typing import Any

importlib.import_module("ister.cli.main")  # first: it imports the command modules in their order
from ister.cli.admin_topics import _described_json, _described_table  # noqa: E402
from ister.wire.gen import DanubeAdmin_pb2 as pb  # noqa: E402
from ister.wire.gen import ister_v1_pb2 as ister_pb  # noqa: E402

TOPIC = pb.DescribeTopicResponse(name="/default/logs", broker_id="0", delivery="Reliable")


def test_describe_shows_a_trained_dictionary_and_one_being_sampled(capsys: Any) -> None:
    trained = ister_pb.CompressionResponse(
        compression="zstd", source="topic", dictionary=True, dictionary_id=7
    )
    _described_table((TOPIC, [], trained, None))
    assert "Compression:   zstd (topic), dictionary 7\n" in capsys.readouterr().out
    assert _described_json((TOPIC, [], trained, None)) == {
        "name": "/default/logs",
        "broker_id": "0",
        "delivery": "Reliable",
        "subscriptions": [],
        "compression": "zstd",
        "compression_source": "topic",
        "compression_dictionary": True,
        "compression_dictionary_id": 7,
    }
    sampling = ister_pb.CompressionResponse(compression="zstd", source="namespace", dictionary=True)
    _described_table((TOPIC, [], sampling, None))
    assert "Compression:   zstd (namespace), dictionary (sampling)\n" in capsys.readouterr().out
    shown = json.loads(json.dumps(_described_json((TOPIC, [], sampling, None))))
    assert shown["compression_dictionary_id"] is None
    plain = ister_pb.CompressionResponse(compression="lz4", source="namespace")
    _described_table((TOPIC, [], plain, None))
    assert "Compression:   lz4 (namespace)\n" in capsys.readouterr().out
    assert "compression_dictionary" not in _described_json((TOPIC, [], plain, None))
