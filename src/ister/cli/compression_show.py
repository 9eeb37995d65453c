"""How a topic's or namespace's compression in effect is shown: by `ister admin ... compression` and by
`ister admin topics describe` (a module without commands, so either can import it)."""

from __future__ import annotations

from ister.wire.gen import ister_v1_pb2 as ister_pb


def shown(r: ister_pb.CompressionResponse, topic: bool = True) -> str:
    """A topic's dictionary is its id, or "sampling" until its first records trained it; a namespace has
    none of its own (each topic trains its own: docs/compression.md). `topics describe` shows it too."""
    text = f"{r.compression} ({r.source})"
    if r.dictionary and not topic:
        return text + ", a dictionary per topic"
    if r.dictionary:
        return text + (f", dictionary {r.dictionary_id}" if r.dictionary_id else ", dictionary (sampling)")
    return text


def dictionary_fields(r: ister_pb.CompressionResponse, topic: bool = True) -> dict[str, object]:
    """The JSON beside the codec: `dictionary` when one is asked for, a topic's `dictionary_id` (null while
    sampling)."""
    fields: dict[str, object] = {}
    if r.dictionary:
        fields["dictionary"] = True
    if r.dictionary and topic:
        fields["dictionary_id"] = r.dictionary_id or None
    return fields
