"""Three ways to produce, timed on the same topic: one send at a time, explicit batches, concurrent async sends.

    python examples/batch_and_async_producer.py --messages 2000

* ``Producer.send`` waits for each message's answer: one HTTP round trip per message.
* ``Producer.send_batch`` sends a list of messages (one topic) in one request to one queue; each message still
  gets its own SendResult with its own offset.
* ``AsyncProducer.send`` from many coroutines at once: the SDK batches concurrent sends of a topic by itself
  (group commit), so throughput grows with concurrency without any code for it.
"""

from __future__ import annotations

import asyncio
import sys
import time

import _common

from client import Admin, AsyncProducer, Message, Producer

TOPIC = "ProducerExampleTopic"
BODY = b"x" * 256


def one_at_a_time(namesrv: str, n: int) -> float:
    with Producer("example-sync", namesrv) as producer:
        start = time.perf_counter()
        for i in range(n):
            producer.send(Message(TOPIC, BODY, keys=[f"single-{i}"]))
        return time.perf_counter() - start


def in_batches(namesrv: str, n: int, batch_size: int = 64) -> float:
    with Producer("example-batch", namesrv) as producer:
        start = time.perf_counter()
        for first in range(0, n, batch_size):
            batch = [Message(TOPIC, BODY, keys=[f"batch-{i}"]) for i in range(first, min(n, first + batch_size))]
            results = producer.send_batch(batch)  # all in one queue, offsets consecutive
            assert len(results) == len(batch)
        return time.perf_counter() - start


async def concurrently(namesrv: str, n: int, concurrency: int = 64) -> float:
    async with AsyncProducer("example-async", namesrv) as producer:
        sem = asyncio.Semaphore(concurrency)  # bound the sends in flight, as a real service would

        async def one(i: int) -> None:
            async with sem:
                await producer.send(Message(TOPIC, BODY, keys=[f"async-{i}"]))

        start = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        return time.perf_counter() - start


def main() -> int:
    args = _common.parser(__doc__, messages=1000).parse_args()
    n = args.messages
    with _common.cluster(args.namesrv) as (namesrv, _):
        with Admin(namesrv) as admin:
            admin.create_topic(TOPIC, queue_nums=4)
        figures = {
            "send, one at a time": one_at_a_time(namesrv, n),
            "send_batch of 64": in_batches(namesrv, n),
            "async send x64 concurrent": asyncio.run(concurrently(namesrv, n)),
        }
    print(f"{'method':<28}{'messages':>10}{'seconds':>10}{'msgs/s':>10}")
    for name, secs in figures.items():
        print(f"{name:<28}{n:>10}{secs:>10.2f}{n / secs:>10,.0f}")
    print(f"batch_and_async: produced {3 * n} messages three ways")
    return 0


if __name__ == "__main__":
    sys.exit(main())
