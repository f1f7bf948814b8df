"""``splitmq dashboard``: a web page that shows a running cluster, served by one command (docs/DASHBOARD.md).

Topology (groups, masters, slaves, DLedger peers; up or down), replication per slave over time, topics and
queues, consumer groups with their lag and the member that served each queue's last pulls (system groups and
topics apart), dead-letter topics, a message browser (by queue, key, id or time) and each broker's metrics, with
history downsampled to six hours; and three guarded actions (create or update a topic or a subscription group,
reset an offline group's offsets). The page is static HTML, JS and CSS shipped in this package (no build step);
it polls a JSON API every second. Everything comes from the SDK's public API (:class:`client.Admin`).
"""

from __future__ import annotations

from client.dashboard._app import build_app, parse_metrics
from client.dashboard._collector import Collector
from client.dashboard._server import DashboardServer

__all__ = ["Collector", "DashboardServer", "build_app", "parse_metrics"]
