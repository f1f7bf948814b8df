"""``splitmq dashboard``: a web page that shows a running cluster, served by one command (docs/DASHBOARD.md).

Topology (groups, masters, slaves, DLedger peers; up or down), replication per slave over time, topics and
queues, consumer groups with their lag and the member that served each queue's last pulls, a message browser and
each broker's metrics. The page is static HTML, JS and CSS shipped in this package (no build step); it polls a
read-only JSON API every second. Everything comes from the SDK's public API (:class:`client.Admin`).
"""

from __future__ import annotations

from client.dashboard._app import build_app, parse_metrics
from client.dashboard._collector import Collector
from client.dashboard._server import DashboardServer

__all__ = ["Collector", "DashboardServer", "build_app", "parse_metrics"]
