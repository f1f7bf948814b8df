"""Classic master/slave HA: byte-level commit-log replication (docs/BEHAVIOUR.md section 2).

The master runs :class:`HAService` (the HA listener is opened on every broker); a slave runs :class:`HAClient`
against its master's HA address. Both are asyncio-only and live in the broker's event loop.
"""

from broker.ha.client import HAClient, HAOffsetMismatchError, parse_ha_addr
from broker.ha.config import HAConfig
from broker.ha.protocol import HAProtocolError
from broker.ha.service import HAService

__all__ = ["HAClient", "HAConfig", "HAOffsetMismatchError", "HAProtocolError", "HAService", "parse_ha_addr"]
