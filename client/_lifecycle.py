"""The lifecycle every producer and consumer shares: UNOPENED -> OPENED -> CLOSED around the shared client
instance (httpx's ``ClientState`` pattern: ``__enter__`` returns self, a second start or a reopen raises).

``close`` is not here: each user has its own (a producer drains its accumulator, a consumer just releases).
"""

from __future__ import annotations

import threading
from typing import Any, ClassVar, Self

from client._instance import AsyncClientInstance, ClientConfig, ClientInstance, ClientState
from common.errors import ClientClosedError, ClientError

__all__ = ["AsyncLifecycle", "SyncLifecycle"]


class _Base:
    _kind: ClassVar[str] = "client"
    """``producer`` or ``consumer``, for error messages."""
    group: str
    namesrv_addr: str
    _client_config: ClientConfig | None
    _state: ClientState

    def _attach(self, client: Any) -> None:
        """Register with the client instance (heartbeat groups)."""
        raise NotImplementedError

    def _closed_error(self) -> ClientClosedError:
        return ClientClosedError(f"{self._kind} {self.group} is closed; create a new one")

    def _already_started(self) -> ClientError:
        return ClientError(f"{self._kind} {self.group} is already started")


class SyncLifecycle(_Base):
    """For thread-safe synchronous users of :class:`ClientInstance` (the subclass sets ``_lock``)."""

    _lock: threading.Lock
    _client: ClientInstance | None

    def start(self) -> Self:
        """Attach to the shared client instance. Raises ClientError when already started or closed."""
        with self._lock:
            if self._state is ClientState.CLOSED:
                raise self._closed_error()
            if self._state is ClientState.OPENED:
                raise self._already_started()
            self._open()
        return self

    def _open(self) -> None:
        self._client = ClientInstance.acquire(self.namesrv_addr, self._client_config)
        self._attach(self._client)
        self._state = ClientState.OPENED

    def _ensure_open(self) -> ClientInstance:
        """The client instance, opening on first use; ClientClosedError after close."""
        client = self._client
        if self._state is ClientState.OPENED and client is not None:
            return client
        with self._lock:
            if self._state is ClientState.CLOSED:
                raise self._closed_error()
            if self._state is ClientState.UNOPENED:
                self._open()
        assert self._client is not None
        return self._client

    @property
    def client(self) -> ClientInstance:
        """The process-wide client instance this user shares."""
        return self._ensure_open()

    def __enter__(self) -> Self:
        if self._state is ClientState.UNOPENED:
            self.start()
        elif self._state is ClientState.CLOSED:
            raise self._closed_error()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        raise NotImplementedError


class AsyncLifecycle(_Base):
    """For users of :class:`AsyncClientInstance` (one per event loop)."""

    _client: AsyncClientInstance | None

    async def start(self) -> Self:
        """Attach to the client instance of the running loop. Raises ClientError when started or closed."""
        if self._state is ClientState.CLOSED:
            raise self._closed_error()
        if self._state is ClientState.OPENED:
            raise self._already_started()
        self._open()
        return self

    def _open(self) -> AsyncClientInstance:
        self._client = AsyncClientInstance.acquire(self.namesrv_addr, self._client_config)
        self._attach(self._client)
        self._state = ClientState.OPENED
        return self._client

    def _ensure_open(self) -> AsyncClientInstance:
        if self._state is ClientState.OPENED and self._client is not None:
            return self._client
        if self._state is ClientState.CLOSED:
            raise ClientClosedError(f"{self._kind} {self.group} is closed")
        return self._open()

    @property
    def client(self) -> AsyncClientInstance:
        """The client instance shared on this event loop (start first)."""
        if self._client is None:
            raise ClientError(f"{self._kind} {self.group} is not started: use 'async with' or await start()")
        return self._client

    async def __aenter__(self) -> Self:
        if self._state is ClientState.UNOPENED:
            await self.start()
        elif self._state is ClientState.CLOSED:
            raise self._closed_error()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        raise NotImplementedError
