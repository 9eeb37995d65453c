"""storage/objects: the durable tier. obstore adapter (`store`), the `.dnb1` object format (`segment`),
descriptors in the metadata store (`catalog`), WAL export (`exporter`), local retention (`retention`) and
the objects -> WAL -> live reader (`tiered`). See docs/formats.md, "Durable objects (.dnb1)"."""

from .catalog import ObjectDescriptor, covering, list_descriptors, record
from .exporter import SegmentExporter
from .retention import LocalRetention, deletable
from .segment import build_segment, list_segments, object_key, read_segment, topic_object_prefix
from .store import ObjectStore, ObjectStoreUnavailable, open_store
from .tiered import TieredReader

__all__ = [
    "LocalRetention",
    "ObjectDescriptor",
    "ObjectStore",
    "ObjectStoreUnavailable",
    "SegmentExporter",
    "TieredReader",
    "build_segment",
    "covering",
    "deletable",
    "list_descriptors",
    "list_segments",
    "object_key",
    "open_store",
    "read_segment",
    "record",
    "topic_object_prefix",
]
