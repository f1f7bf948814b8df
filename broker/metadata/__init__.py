"""The broker's JSON metadata under ``storePathRootDir/config/``: topics, consumer offsets, subscription groups,
delay offsets. Each manager keeps its table in memory, persists atomically and keeps the previous file as
``<name>.bak`` (load falls back to it), as RocketMQ's ``ConfigManager`` does."""

from broker.metadata.consumer_offsets import ConsumerOffsetManager
from broker.metadata.delay_offsets import DelayOffsetManager
from broker.metadata.json_file import JsonFile
from broker.metadata.subscription_groups import SubscriptionGroupConfig, SubscriptionGroupManager
from broker.metadata.topics import TopicConfigManager

__all__ = [
    "ConsumerOffsetManager",
    "DelayOffsetManager",
    "JsonFile",
    "SubscriptionGroupConfig",
    "SubscriptionGroupManager",
    "TopicConfigManager",
]
