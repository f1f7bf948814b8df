"""SplitMQ SDK: producers, pull consumers and admin for a RocketMQ-style broker cluster over HTTP.

::

    from client import Producer, PullConsumer, Message

    with Producer("my-group", "127.0.0.1:9876") as p:
        p.send(Message("TopicTest", b"hello", tags="TagA"))

Errors live in :mod:`client.errors` (also reachable as ``client.errors``); the local cluster launcher in
:mod:`client.cluster`; raw sends and pulls of encoded batches with the SDK's routing and retries, the route cache
and the pull-node table in :mod:`client.lowlevel`; the wire formats, which the servers speak too, in
:mod:`common`. Everything under ``client._*`` is private.
"""

from __future__ import annotations

from client import errors
from client._admin import Admin, ClusterInfo, QueueProgress
from client._async_group_consumer import AsyncGroupConsumer
from client._consume_core import GroupConsumerConfig, RebalanceListener
from client._consumer import AsyncPullConsumer, PullConsumer
from client._delivery import DeliveryCallback
from client._group_consumer import GroupConsumer
from client._instance import AsyncClientInstance, ClientConfig, ClientInstance, ClientState
from client._producer import AsyncProducer, Producer
from client._push_consumer import ConsumeStatus, PushConsumer
from client._rebalance import (
    AllocateMessageQueueAveragely,
    AllocateMessageQueueAveragelyByCircle,
    ConsumeFromWhere,
    MessageModel,
)
from client._requests import PullResult, SendResult
from client._routing import FindBrokerResult
from client._transaction import (
    AsyncTransactionProducer,
    LocalTransactionState,
    TransactionListener,
    TransactionProducer,
    TransactionSendResult,
)
from common.codes import PullStatus, SendStatus
from common.message import Message, MessageExt, MessageQueue
from common.selector import MessageSelector
from common.signing import Credentials

__all__ = [
    "Admin",
    "AllocateMessageQueueAveragely",
    "AllocateMessageQueueAveragelyByCircle",
    "AsyncClientInstance",
    "AsyncGroupConsumer",
    "AsyncProducer",
    "AsyncPullConsumer",
    "AsyncTransactionProducer",
    "ClientConfig",
    "ClientInstance",
    "ClientState",
    "ClusterInfo",
    "ConsumeFromWhere",
    "ConsumeStatus",
    "Credentials",
    "DeliveryCallback",
    "FindBrokerResult",
    "GroupConsumer",
    "GroupConsumerConfig",
    "LocalTransactionState",
    "Message",
    "MessageExt",
    "MessageModel",
    "MessageQueue",
    "MessageSelector",
    "Producer",
    "PullConsumer",
    "PullResult",
    "PullStatus",
    "PushConsumer",
    "QueueProgress",
    "RebalanceListener",
    "SendResult",
    "SendStatus",
    "TransactionListener",
    "TransactionProducer",
    "TransactionSendResult",
    "errors",
]
