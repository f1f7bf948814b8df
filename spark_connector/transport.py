"""The connector's wire access: the SDK's low-level client keyed by the connector's queue keys, and a pool.

The reader needs the *raw* record bytes of each pull (decoding them to ``MessageExt`` objects first would cost
more than the whole Arrow conversion), explicit control over which member of a broker group answers, and route
snapshots it can ship inside Spark partitions; the sink sends batches it encodes itself. All of that is the
SDK's public low-level layer, :class:`client.lowlevel.BrokerClient` (routes, :meth:`~client.lowlevel.BrokerClient.
pull_raw_from`, :meth:`~client.lowlevel.BrokerClient.send_encoded` with the producer's retries, queue offsets,
offset commits); this module adds the connector's :class:`~spark_connector.offsets.QueueKey` spelling of the
per-queue member hints (the SDK's ``pullFromWhichNodeTable``) and of a pull.

:func:`pooled_client` hands out the module-level client of the current Python worker, so later tasks reuse its
connections, routes and hints.
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Mapping

import httpx

from client import ClientConfig, Credentials
from client.lowlevel import BrokerClient as _SdkClient
from client.lowlevel import RawPullResult
from common.selector import MessageSelector
from spark_connector.offsets import QueueKey

log = logging.getLogger(__name__)

__all__ = ["BrokerClient", "RawPull", "close_pool", "pooled_client"]

#: Consumer group named in pull requests when the user gave none (brokers auto-create subscription groups).
DEFAULT_READER_GROUP = "spark-rocketmq-reader"

#: One pull answer with its records left as stored bytes.
RawPull = RawPullResult


class BrokerClient(_SdkClient):
    """The SDK's low-level client plus the connector's queue-key helpers (thread-safe; one per worker process).

    Args:
        namesrv_addr: ``;``-joined nameserver addresses.
        transport: the HTTP transport (tests inject ``httpx.MockTransport``).
        credentials: the account that signs every request (options ``accessKey``/``secretKey``).
        tls_ca_file: option ``tlsCaFile``: TLS on every connection, verified against this CA.
    """

    def __init__(self, namesrv_addr: str, *, transport: httpx.BaseTransport | None = None,
                 credentials: Credentials | None = None, tls_ca_file: str | None = None) -> None:
        config = ClientConfig(tls_ca_file=tls_ca_file) if tls_ca_file is not None else None
        super().__init__(namesrv_addr, transport=transport, credentials=credentials, config=config)

    def hint(self, key: QueueKey) -> int:
        """The broker id the last pull of ``key`` suggested (0 = master when never pulled)."""
        return self.pull_nodes.recalculate(key.message_queue)

    def set_hint(self, key: QueueKey, broker_id: int) -> None:
        """Remember a pull's suggested member for ``key``."""
        self.pull_nodes.update(key.message_queue, broker_id)

    def pull(
        self, addr: str, key: QueueKey, offset: int, *, max_nums: int, max_bytes: int,
        sub_expression: str | MessageSelector, group: str, timeout_s: float,
    ) -> RawPull:
        """One ``GET /pull`` to the member at ``addr``, without long polling; the records stay raw.

        Raises:
            TransportError: no answer (connect error or timeout).
            BrokerError: the broker answered an error code.
        """
        return self.pull_raw_from(addr, key.message_queue, offset, group=group, max_nums=max_nums,
                                  max_bytes=max_bytes, sub_expression=sub_expression, timeout_s=timeout_s)


# --- the per-worker pool --------------------------------------------------------------------------------

#: One client per (nameserver list, client options) in this Python process. Spark reuses Python workers
#: across tasks and queries, so connections and broker hints outlive a single task.
_POOL: dict[tuple[str, tuple[tuple[str, str], ...], Credentials | None, str | None], BrokerClient] = {}
_POOL_LOCK = threading.Lock()
_POOL_MAX = 16


def pooled_client(namesrv_addr: str, client_options: Mapping[str, str] | None = None,
                  credentials: Credentials | None = None, *, tls_ca_file: str | None = None) -> BrokerClient:
    """This process's shared :class:`BrokerClient` for ``namesrv_addr`` and the account (created on first use).

    Args:
        namesrv_addr: ``;``-joined nameserver addresses.
        client_options: the ``client.*`` options (part of the pool key).
        credentials: the account of options ``accessKey``/``secretKey`` (part of the pool key: two jobs of one
            worker with different accounts never share a client).
        tls_ca_file: option ``tlsCaFile`` (part of the pool key too).

    Returns:
        The pooled client.
    """
    key = (namesrv_addr, tuple(sorted((client_options or {}).items())), credentials, tls_ca_file)
    with _POOL_LOCK:
        c = _POOL.get(key)
        if c is None:
            if len(_POOL) >= _POOL_MAX:  # bound the pool: drop the oldest client
                _, old = next(iter(_POOL.items()))
                _POOL.pop(next(iter(_POOL)))
                old.close()
            c = _POOL[key] = BrokerClient(namesrv_addr, credentials=credentials, tls_ca_file=tls_ca_file)
        return c


def close_pool() -> None:
    """Close every pooled client (registered with ``atexit``; Spark never calls ``stop()`` reliably)."""
    with _POOL_LOCK:
        clients = list(_POOL.values())
        _POOL.clear()
    for c in clients:
        try:
            c.close()
        except Exception:  # closing at exit must not raise
            log.debug("closing a pooled client failed", exc_info=True)


atexit.register(close_pool)
