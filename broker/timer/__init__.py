"""Timed delivery (RocketMQ 5's timer messages): the rules of a timed send (:mod:`broker.timer.rules`), the
in-memory index over the parked messages (:mod:`broker.timer.index`) and the master's delivery service
(:mod:`broker.timer.service`)."""

from broker.timer.index import Entry, TimerIndex
from broker.timer.rules import TIMER_TOPIC, deliver_ms_of, has_timer, restore_timer_message, route_timer_send
from broker.timer.service import TimerMessageService

__all__ = [
    "TIMER_TOPIC",
    "Entry",
    "TimerIndex",
    "TimerMessageService",
    "deliver_ms_of",
    "has_timer",
    "restore_timer_message",
    "route_timer_send",
]
