"""What the chaos workload sent, what was acknowledged, and how many times the client tried each message.

Every message body starts with its key, ``chaos:PPPP.SSSSSSSSSS|`` (producer number, sequence number): the
checker reads keys back out of the stored records, and :class:`AttemptCounter` reads them out of every
``POST /send`` the SDK makes, so "how many times did the client send this message" is a fact, not a guess. A
stored copy beyond the number of attempts cannot be a client retry.

The ledger is arrays indexed by sequence number, one set per producer (a few bytes per message: the full profile
has millions).
"""

from __future__ import annotations

import re
import threading
from array import array
from collections import Counter

import attrs
import httpx

__all__ = ["KEY_RE", "MARK", "AttemptCounter", "Ledger", "Location", "body_of", "key_of", "make_key", "split_key"]

MARK = b"chaos:"
KEY_RE = re.compile(rb"chaos:(\d{4})\.(\d{10})\|")
_SEQ_BITS = 40
_SEQ_MASK = (1 << _SEQ_BITS) - 1
_QUEUE_BITS = 16
_OFFSET_BITS = 40


def body_of(producer: int, seq: int, pad: bytes) -> bytes:
    """The body of message ``seq`` of ``producer``: its key, then ``pad``."""
    return b"chaos:%04d.%010d|" % (producer, seq) + pad


def key_of(body: bytes) -> int:
    """The key packed as one int (``producer << 40 | seq``), or -1 when ``body`` is not a chaos message."""
    if body[:6] != MARK or body[21:22] != b"|":
        return -1
    try:
        return make_key(int(body[6:10]), int(body[11:21]))
    except ValueError:
        return -1


def make_key(producer: int, seq: int) -> int:
    """The packed key of message ``seq`` of ``producer`` (what :func:`key_of` returns for its body)."""
    return producer << _SEQ_BITS | seq


def split_key(key: int) -> tuple[int, int]:
    """``(producer, seq)`` of a packed key."""
    return key >> _SEQ_BITS, key & _SEQ_MASK


@attrs.frozen
class Location:
    """Where an acknowledged message is: group index, queue id, queue offset."""

    group: int
    queue_id: int
    queue_offset: int

    def pack(self) -> int:
        return (self.group << (_QUEUE_BITS + _OFFSET_BITS)) | (self.queue_id << _OFFSET_BITS) | self.queue_offset

    @classmethod
    def unpack(cls, packed: int) -> Location:
        return cls(packed >> (_QUEUE_BITS + _OFFSET_BITS), (packed >> _OFFSET_BITS) & ((1 << _QUEUE_BITS) - 1),
                   packed & ((1 << _OFFSET_BITS) - 1))


class Ledger:
    """Sends, acknowledgements and attempts of every producer of one run; thread-safe.

    Args:
        producers: number of producers (numbered from 0).
    """

    def __init__(self, producers: int) -> None:
        self._lock = threading.Lock()
        self.sent = [0] * producers
        """Messages each producer has handed to the SDK (its next sequence number)."""
        self.attempts = [bytearray() for _ in range(producers)]
        """Per producer and sequence number: ``POST /send`` requests that carried the message (at most 255)."""
        self.acked = [array("q") for _ in range(producers)]
        """Per producer and sequence number: the packed :class:`Location` of its SEND_OK, or -1."""
        self.acked_phy = [array("q") for _ in range(producers)]
        """Per producer and sequence number: the commit-log offset of its SEND_OK, or -1."""
        self.outcomes: Counter[str] = Counter()
        """Messages by outcome: ``SEND_OK``, another send status, or the error class of a failed send."""
        self.acked_high: dict[tuple[int, int], int] = {}
        """``(group, queue id) -> 1 + the highest acknowledged queue offset``."""
        self.max_acked_phy: dict[int, int] = {}
        """``group -> the highest commit-log offset acknowledged``."""

    def reserve(self, producer: int, n: int) -> int:
        """Make room for the next ``n`` messages of ``producer``; returns the first one's sequence number."""
        with self._lock:
            first = self.sent[producer]
            self.sent[producer] = first + n
            self.attempts[producer].extend(bytes(n))
            self.acked[producer].extend([-1] * n)
            self.acked_phy[producer].extend([-1] * n)
        return first

    def attempted(self, request_body: bytes) -> int:
        """Count one attempt for every message in a ``POST /send`` body; returns how many it carried."""
        found = KEY_RE.findall(request_body)
        with self._lock:
            for p, s in found:
                producer, seq = int(p), int(s)
                counts = self.attempts[producer] if producer < len(self.attempts) else None
                if counts is not None and seq < len(counts) and counts[seq] < 255:
                    counts[seq] += 1
        return len(found)

    def ack(self, producer: int, seq: int, where: Location, phy_offset: int) -> None:
        """Message ``seq`` of ``producer`` was answered SEND_OK at ``where``."""
        with self._lock:
            self.acked[producer][seq] = where.pack()
            self.acked_phy[producer][seq] = phy_offset
            self.outcomes["SEND_OK"] += 1
            q = (where.group, where.queue_id)
            if where.queue_offset + 1 > self.acked_high.get(q, 0):
                self.acked_high[q] = where.queue_offset + 1
            if phy_offset > self.max_acked_phy.get(where.group, -1):
                self.max_acked_phy[where.group] = phy_offset

    def outcome(self, what: str, n: int = 1) -> None:
        """``n`` messages ended otherwise than SEND_OK (a status name, or an error class name)."""
        with self._lock:
            self.outcomes[what] += n

    def acked_from(self, group: int, phy_offset: int) -> int:
        """Acknowledged messages of ``group`` stored at ``phy_offset`` or later in its commit log."""
        if self.max_acked_phy.get(group, -1) < phy_offset:
            return 0  # the common case, without a scan
        n = 0
        for producer, locations in enumerate(self.acked):
            phys = self.acked_phy[producer]
            for seq in range(len(phys)):  # by index: producers append meanwhile
                packed = locations[seq]
                if packed >= 0 and phys[seq] >= phy_offset and Location.unpack(packed).group == group:
                    n += 1
        return n

    @property
    def acknowledged(self) -> int:
        return self.outcomes["SEND_OK"]

    def high(self, group: int, queue_id: int) -> int:
        """1 + the highest acknowledged offset of a queue (0: none yet)."""
        return self.acked_high.get((group, queue_id), 0)


class AttemptCounter(httpx.BaseTransport):
    """An httpx transport that counts, in a :class:`Ledger`, the messages of every ``POST /send`` that may have
    reached a broker, then makes the request with ``inner``.

    A request refused at connect (nothing reached a broker) is not counted; one that timed out or lost its
    connection later is: the broker may have stored it.
    """

    def __init__(self, ledger: Ledger, inner: httpx.BaseTransport | None = None) -> None:
        self._ledger = ledger
        self._inner = inner or httpx.HTTPTransport(limits=httpx.Limits(max_connections=64,
                                                                        max_keepalive_connections=32))
        self.sends = 0
        """``POST /send`` requests seen."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.method != "POST" or request.url.path != "/send":
            return self._inner.handle_request(request)
        self.sends += 1
        try:
            response = self._inner.handle_request(request)
        except (httpx.ConnectError, httpx.ConnectTimeout):
            raise  # no byte of the request left this process
        except BaseException:
            self._ledger.attempted(request.content)
            raise
        self._ledger.attempted(request.content)
        return response

    def close(self) -> None:
        self._inner.close()
