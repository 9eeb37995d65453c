"""Ister's own asyncio client, speaking the batch API (`ister.v1`), and a blocking facade.

    async with Client("http://127.0.0.1:6650") as client:
        producer = await client.producer("/default/events")
        offset = await producer.send(b"hello", attributes={"k": "v"})
        consumer = await client.consumer("/default/events", "sub", type="shared")
        async for msg in consumer:
            await msg.ack()

Delivery is at-least-once in both directions; see the docstrings of `Producer` and `Consumer`.
Errors are the classes of `ister.errors` (InvalidArgument, NotFound, Unavailable, ...).
"""

from ister.client.client import Client, TopicLookup
from ister.client.consumer import Consumer, SubType
from ister.client.messages import Message
from ister.client.producer import Producer
from ister.client.routing import fnv1a_64

__all__ = ["Client", "Consumer", "Message", "Producer", "SubType", "TopicLookup", "fnv1a_64"]
