"""The SDK's exceptions, as :mod:`common.errors` defines them for the SDK and the servers alike.

The tree, drawn in :mod:`common.errors`, is rooted at :class:`ClientError`; each class carries RocketMQ's response
code (``code``), whether a retry may help (``retriable``) and whether the route should be refreshed first
(``invalid_metadata``). ``BrokerError.for_code`` builds the most specific class for a code.
"""

from __future__ import annotations

from common.errors import *  # noqa: F403 - the whole tree, under the name users import
from common.errors import __all__ as __all__
