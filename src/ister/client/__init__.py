"""Ister's own asyncio client, speaking the batch API (`ister.v1`), and a blocking facade.

    async with Client("http://127.0.0.1:6650") as client:
        producer = await client.producer("/default/events")
        offset = await producer.send(b"hello", attributes={"k": "v"})
        consumer = await client.consumer("/default/events", "sub", type="shared")
        async for msg in consumer:
            await msg.ack()

Reliable topics can also be read by offset range, without a subscription:

        span = await client.offsets("/default/events")  # TopicOffsets(earliest, next, durable_url, ...)
        async for batch in client.read("/default/events", span.earliest, span.next):
            for offset, record in batch:  # the stored record: ister.core.record.decode_message(record)
                ...

Delivery is at-least-once in both directions; see the docstrings of `Producer` and `Consumer`.
Errors are the classes of `ister.errors` (InvalidArgument, NotFound, Unavailable, ...).
"""

from ister.client.client import Client, TopicOffsets
from ister.client.connection import TopicLookup
from ister.client.consumer import Consumer, SubType
from ister.client.messages import Message
from ister.client.producer import Producer
from ister.client.routing import fnv1a_64

__all__ = ["Client", "Consumer", "Message", "Producer", "SubType", "TopicLookup", "TopicOffsets", "fnv1a_64"]
