"""Broker configuration: properties syntax, defaults, the seeds' file, bad values, unknown keys, role and port
rules, and the derived store/HA configurations."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.config import BrokerConfig, ConfigError, config_from_properties, load_config, parse_set_options
from broker.properties_file import PropertiesSyntaxError, parse_properties
from common.codec import pack_host
from common.codes import BrokerRole, FlushDiskType

SEEDS_MASTER = """
      #所屬集群名字
      brokerClusterName=DefaultCluster
      #broker名字,名字可重復
      brokerName=broker-a
      #節點ID,0 表示 Master 節點
      brokerId=0
      #- ASYNC_MASTER 異步復制Master
      brokerRole=ASYNC_MASTER
      flushDiskType=ASYNC_FLUSH
      #nameServer地址,分號分割
      namesrvAddr=172.0.1.5:9876;172.0.1.6:9876
"""


def load(props: dict[str, str]) -> BrokerConfig:
    return config_from_properties(props, env={}).config


# --- properties syntax ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a=1", {"a": "1"}),
        ("a = 1", {"a": "1"}),
        ("a:1", {"a": "1"}),
        ("a 1", {"a": "1"}),
        ("  a=1  \n", {"a": "1"}),
        ("# c\n! c\na=1", {"a": "1"}),
        ("a=1\\\n   2", {"a": "12"}),
        ("a=x\\\\\nb=2", {"a": "x\\", "b": "2"}),
        ("a=\\u0041\\tB", {"a": "A\tB"}),
        ("a\\=b=c", {"a=b": "c"}),
        ("a=", {"a": ""}),
        ("a=1\na=2", {"a": "2"}),
        ("a=1\\\n# not a comment", {"a": "1# not a comment"}),
    ],
)
def test_properties_syntax(text: str, expected: dict[str, str]) -> None:
    assert parse_properties(text) == expected


def test_properties_bad_unicode_escape_names_line() -> None:
    with pytest.raises(PropertiesSyntaxError, match="line 2"):
        parse_properties("a=1\nb=\\u12G4")


# --- defaults and the seeds' file ------------------------------------------------------------------------


def test_defaults() -> None:
    c = load({"brokerName": "b"})
    assert c.broker_cluster_name == "DefaultCluster"
    assert (c.broker_id, c.broker_role, c.flush_disk_type) == (0, BrokerRole.ASYNC_MASTER, FlushDiskType.ASYNC_FLUSH)
    assert (c.listen_port, c.ha_listen_port) == (10911, 10912)
    assert c.broker_ip1 == "127.0.0.1"
    assert c.store_root == Path("~/store").expanduser()
    assert (c.slave_read_enable, c.access_message_in_memory_max_ratio) == (False, 40)
    assert (c.sync_flush_timeout_ms, c.ha_max_gap_not_in_sync, c.default_topic_queue_nums) == (2000, 1 << 28, 8)
    assert c.register_period_ms == 30_000
    assert c.slave_metadata_sync_interval_ms == 10_000
    assert c.namesrv_addr == ()


def test_seeds_master_file(tmp_path: Path) -> None:
    f = tmp_path / "broker-a.properties"
    f.write_text(SEEDS_MASTER, encoding="utf-8")
    loaded = load_config(f, env={})
    c = loaded.config
    assert loaded.unknown_keys == ()
    assert (c.broker_cluster_name, c.broker_name, c.broker_id) == ("DefaultCluster", "broker-a", 0)
    assert c.broker_role is BrokerRole.ASYNC_MASTER
    assert c.namesrv_addr == ("172.0.1.5:9876", "172.0.1.6:9876")


def test_set_overrides_file(tmp_path: Path) -> None:
    f = tmp_path / "b.properties"
    f.write_text(SEEDS_MASTER + "listenPort=1234\n", encoding="utf-8")
    c = load_config(f, parse_set_options(["listenPort=0", "storePathRootDir = /x/y"]), env={}).config
    assert (c.listen_port, c.ha_listen_port, c.store_path_root_dir) == (0, 0, "/x/y")


def test_namesrv_from_environment_only_when_not_configured() -> None:
    env = {"NAMESRV_ADDR": "10.0.0.1:9876"}
    assert config_from_properties({}, env=env).config.namesrv_addr == ("10.0.0.1:9876",)
    assert config_from_properties({"namesrvAddr": "10.0.0.2:1"}, env=env).config.namesrv_addr == ("10.0.0.2:1",)


# --- bad values and unknown keys -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("listenPort", "10911x", "listenPort='10911x' is not an integer"),
        ("listenPort", "70000", "listenPort=70000 is outside"),
        ("brokerId", "one", "brokerId='one'"),
        ("slaveReadEnable", "yes", "slaveReadEnable='yes' is not true or false"),
        ("brokerRole", "sync_master", "brokerRole='sync_master' is not one of ASYNC_MASTER, SYNC_MASTER, SLAVE"),
        ("flushDiskType", "SYNC", "flushDiskType='SYNC'"),
        ("namesrvAddr", "localhost", "namesrvAddr: 'localhost' is not host:port"),
        ("namesrvAddr", "a:1;b:x", "namesrvAddr: 'b:x'"),
        ("brokerIP1", "my-host", "brokerIP1='my-host' is not an IP address"),
        ("accessMessageInMemoryMaxRatio", "101", "accessMessageInMemoryMaxRatio=101"),
        ("brokerPermission", "16", "brokerPermission=16"),
        ("messageDelayLevel", "1s 5x", "messageDelayLevel"),
        ("syncFlushTimeout", "0", "syncFlushTimeout=0"),
        ("brokerName", "", "brokerName is empty"),
    ],
)
def test_bad_value_names_key_and_value(key: str, value: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match.replace("[", r"\[").replace("(", r"\(")):
        load({key: value})


def test_trailing_space_is_trimmed_not_silently_false() -> None:
    assert load({"slaveReadEnable": "true "}).slave_read_enable is True
    assert load({"listenPort": "10911 "}).listen_port == 10911


def test_unknown_keys_reported_sorted() -> None:
    loaded = config_from_properties({"transientStorePoolEnable": "true", "deleteWhen": "04", "traceTopicEnable": "false",
                                     "brokerName": "b"}, env={})
    assert loaded.unknown_keys == ("traceTopicEnable", "transientStorePoolEnable")


def test_retention_keys_reach_the_store() -> None:
    cfg = load({"fileReservedTime": "0.5", "deleteWhen": "04;16", "diskMaxUsedSpaceRatio": "70",
                "diskSpaceCleanForciblyRatio": "80", "diskSpaceWarningLevelRatio": "95", "deleteFileBatchMax": "3",
                "destroyMapedFileIntervalForcibly": "5000", "cleanFileForciblyEnable": "false"})
    store = cfg.to_store_config(b"\x7f\x00\x00\x01\x00\x00\x00\x00")
    r = store.retention
    assert (r.file_reserved_time_ms, r.delete_when, r.delete_file_batch_max) == (1_800_000, (4, 16), 3)
    assert (r.disk_max_used_space_ratio, r.disk_space_clean_forcibly_ratio, r.disk_space_warning_level_ratio) == (
        0.70, 0.80, 0.95)
    assert r.clean_file_forcibly_enable is False
    assert store.destroy_mapped_file_interval_forcibly_ms == 5000
    default = load({}).to_store_config(b"\x7f\x00\x00\x01\x00\x00\x00\x00").retention
    assert (default.file_reserved_time_ms, default.delete_when) == (72 * 3_600_000, (4,))


@pytest.mark.parametrize(("key", "value", "match"), [
    ("deleteWhen", "4;25", "deleteWhen='4;25': deleteWhen part '25' is not an hour"),
    ("deleteWhen", "noon", "is not an hour"),
    ("fileReservedTime", "-1", "must be a positive number of hours"),
    ("fileReservedTime", "x", "is not a number of hours"),
    ("diskMaxUsedSpaceRatio", "99", "is outside"),
])
def test_bad_retention_values_name_the_key(key: str, value: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load({key: value})


def test_unreadable_file_is_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "missing.properties", env={})


def test_set_option_without_equals() -> None:
    with pytest.raises(ConfigError, match="not key=value"):
        parse_set_options(["listenPort"])


# --- role and port rules ---------------------------------------------------------------------------------


@pytest.mark.parametrize("role", ["ASYNC_MASTER", "SYNC_MASTER"])
def test_masters_forced_to_id_zero(role: str) -> None:
    assert load({"brokerRole": role, "brokerId": "3"}).broker_id == 0


@pytest.mark.parametrize("broker_id", ["0", "-1"])
def test_slave_needs_positive_id(broker_id: str) -> None:
    with pytest.raises(ConfigError, match="Slave's brokerId must be > 0"):
        load({"brokerRole": "SLAVE", "brokerId": broker_id})
    with pytest.raises(ConfigError, match="Slave's brokerId must be > 0"):
        load({"brokerRole": "SLAVE"})


def test_slave_keeps_its_id() -> None:
    c = load({"brokerRole": "SLAVE", "brokerId": "2"})
    assert (c.broker_id, c.is_slave) == (2, True)


def _caps(c: BrokerConfig) -> tuple[int, int, int, int]:
    return (c.max_transfer_count_on_message_in_memory, c.max_transfer_bytes_on_message_in_memory,
            c.max_transfer_count_on_message_in_disk, c.max_transfer_bytes_on_message_in_disk)


def test_a_slave_lets_large_pulls_through_and_a_master_keeps_rocketmqs_caps() -> None:
    rocketmq = (32, 256 * 1024, 8, 64 * 1024)
    assert _caps(load({})) == rocketmq
    assert _caps(load({"brokerRole": "SYNC_MASTER"})) == rocketmq
    slave = load({"brokerRole": "SLAVE", "brokerId": "1"})
    assert _caps(slave) == (1024, 4 << 20, 1024, 4 << 20)
    assert slave.to_store_config(pack_host("127.0.0.1", 1)).max_transfer_count_on_message_in_disk == 1024
    set_here = load({"brokerRole": "SLAVE", "brokerId": "1", "maxTransferCountOnMessageInMemory": "32"})
    assert _caps(set_here) == (32, 4 << 20, 1024, 4 << 20)  # what the file sets wins, key by key
    dledger = load({"enableDLegerCommitLog": "true", "dLegerPeers": "n0-127.0.0.1:40911", "dLegerSelfId": "n0"})
    assert dledger.is_slave and _caps(dledger) == rocketmq  # a member may lead: a master's caps


@pytest.mark.parametrize(
    ("props", "ports"),
    [
        ({}, (10911, 10912)),
        ({"listenPort": "30911"}, (30911, 30912)),
        ({"listenPort": "30911", "haListenPort": "40000"}, (30911, 40000)),
        ({"listenPort": "30911", "haListenPort": "0"}, (30911, 30912)),
        ({"listenPort": "30911", "haListenPort": "-5"}, (30911, 30912)),
        ({"listenPort": "0"}, (0, 0)),
        ({"listenPort": "0", "haListenPort": "5555"}, (0, 5555)),
    ],
)
def test_port_rule(props: dict[str, str], ports: tuple[int, int]) -> None:
    c = load(props)
    assert (c.listen_port, c.ha_listen_port) == ports


def test_ha_port_derivation_overflow() -> None:
    with pytest.raises(ConfigError, match="haListenPort"):
        load({"listenPort": "65535"})


def test_haslavefallbehindmax_alias() -> None:
    assert load({"haSlaveFallbehindMax": "1024"}).ha_max_gap_not_in_sync == 1024
    assert load({"haMaxGapNotInSync": "2048"}).ha_max_gap_not_in_sync == 2048


@pytest.mark.parametrize(("period", "floor", "effective"), [
    ("30000", None, 30000), ("1000", None, 10000), ("90000", None, 60000), ("500", "200", 500), ("100", "200", 200),
])
def test_register_period_clamp(period: str, floor: str | None, effective: int) -> None:
    props = {"registerNameServerPeriod": period}
    if floor:
        props["registerNameServerPeriodMinMs"] = floor
    assert load(props).register_period_ms == effective


# --- derived configurations ------------------------------------------------------------------------------


def test_store_config(tmp_path: Path) -> None:
    c = load({"storePathRootDir": str(tmp_path), "brokerRole": "SLAVE", "brokerId": "1",
              "flushDiskType": "SYNC_FLUSH", "mappedFileSizeCommitLog": "65536", "truncateCorruptCommitLog": "true",
              "accessMessageInMemoryMaxRatio": "30", "offsetCheckInSlave": "true", "maxMessageSize": "1024"})
    sc = c.to_store_config(pack_host("127.0.0.1", 9999))
    assert sc.store_path_root_dir == str(tmp_path)
    assert (sc.broker_role, sc.flush_disk_type) == (BrokerRole.SLAVE, FlushDiskType.SYNC_FLUSH)
    assert (sc.mapped_file_size_commitlog, sc.max_message_size, sc.access_message_in_memory_max_ratio) == (65536, 1024, 30)
    assert (sc.truncate_corrupt, sc.offset_check_in_slave) == (True, True)
    assert sc.store_host == pack_host("127.0.0.1", 9999)


def test_ha_config() -> None:
    c = load({"haSendHeartbeatInterval": "100", "haHousekeepingInterval": "900", "haTransferBatchSize": "4096",
              "haSlaveFallbehindMax": "777"})
    h = c.to_ha_config()
    assert (h.ha_send_heartbeat_interval_ms, h.ha_housekeeping_interval_ms, h.ha_transfer_batch_size,
            h.ha_max_gap_not_in_sync) == (100, 900, 4096, 777)


@pytest.mark.parametrize(
    ("props", "delay_ms"),
    [
        ({}, 2),  # ASYNC_MASTER by default: small appends gathered for up to 2 ms
        ({"haAsyncTransferDelayMs": "0"}, 0),
        ({"haAsyncTransferDelayMs": "100"}, 100),  # RocketMQ's writer wait
        ({"brokerRole": "SYNC_MASTER"}, 0),  # its sends wait for the ack: every append goes at once
        ({"brokerRole": "SYNC_MASTER", "haAsyncTransferDelayMs": "50"}, 0),
        ({"brokerRole": "SLAVE", "brokerId": "1", "haAsyncTransferDelayMs": "50"}, 0),
    ],
)
def test_async_transfer_delay_reaches_only_an_async_master(props: dict[str, str], delay_ms: int) -> None:
    assert load(props).to_ha_config().ha_transfer_delay_ms == delay_ms


@pytest.mark.parametrize("value", ["-1", "60001", "2ms"])
def test_async_transfer_delay_bounds(value: str) -> None:
    with pytest.raises(ConfigError, match=f"haAsyncTransferDelayMs={value!r}|haAsyncTransferDelayMs={value}"):
        load({"haAsyncTransferDelayMs": value})


def test_in_sync_replica_keys() -> None:
    h = load({}).to_ha_config()  # a SYNC_MASTER waits for one slave ack by default (decision 5)
    assert (h.in_sync_replicas, h.min_in_sync_replicas, h.enable_auto_in_sync_replicas) == (2, 1, False)
    h = load({"inSyncReplicas": "3", "minInSyncReplicas": "2", "enableAutoInSyncReplicas": "true"}).to_ha_config()
    assert (h.in_sync_replicas, h.min_in_sync_replicas, h.enable_auto_in_sync_replicas) == (3, 2, True)
    with pytest.raises(ConfigError, match="inSyncReplicas=0"):
        load({"inSyncReplicas": "0"})
    with pytest.raises(ConfigError, match="min_in_sync_replicas"):
        load({"inSyncReplicas": "1", "minInSyncReplicas": "2"})


def test_from_properties_named_constructor() -> None:
    c = BrokerConfig.from_properties({"brokerName": "x", "brokerRole": "SYNC_MASTER", "brokerId": "5", "junk": "1"})
    assert (c.broker_name, c.broker_role, c.broker_id) == ("x", BrokerRole.SYNC_MASTER, 0)


def test_derived_config_errors_surface_at_load() -> None:
    with pytest.raises(ConfigError, match="ha_slave_read_buffer_bytes"):
        load({"haTransferBatchSize": str(64 << 20)})
