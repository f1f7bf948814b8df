"""Transactional (two-phase, half) messages: the rules, the check-back queues, and the service (issue 17)."""

from broker.transaction.checks import CheckQueues
from broker.transaction.rules import CHECK_MAX_TOPIC, HALF_TOPIC, OP_TOPIC, TRANSACTION_TOPICS, CheckRules
from broker.transaction.service import TransactionalMessageService

__all__ = ["CHECK_MAX_TOPIC", "HALF_TOPIC", "OP_TOPIC", "TRANSACTION_TOPICS", "CheckQueues", "CheckRules",
           "TransactionalMessageService"]
