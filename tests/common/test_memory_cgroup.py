"""Finding this process's memory cgroup and its effective limit, from fixture trees of ``/proc`` and
``/sys/fs/cgroup`` files (v1, v2, hybrid, nested, unlimited, unreadable, namespaced)."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.memory_cgroup import (
    CgroupDir,
    effective_memory_limit_bytes,
    memory_cgroup_dirs,
    own_memory_cgroup,
    parse_limit,
    parse_mountinfo,
    parse_proc_cgroup,
)

MIB = 1 << 20
V1_NONE = "9223372036854771712\n"  # what v1 reports without a limit (4 KiB pages)

MOUNTS_V1 = (
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"
    "35 31 0:32 / /sys/fs/cgroup/memory rw,nosuid shared:9 - cgroup cgroup rw,memory\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
)
MOUNTS_V2 = "25 20 0:22 / /sys/fs/cgroup rw,nosuid,nodev shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
#: Docker without a cgroup namespace: the host's hierarchy bind-mounted, its root the container's cgroup.
MOUNTS_V1_BIND = "700 690 0:32 /docker/abc /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,memory\n"
#: A mount point with a space in it (escaped as \\040 by the kernel).
MOUNTS_V2_SPACE = "25 20 0:22 / /cg\\040root rw - cgroup2 cgroup2 rw\n"

CASES = [
    pytest.param(
        {"/proc/self/cgroup": "4:memory:/app\n0::/\n", "/proc/self/mountinfo": MOUNTS_V1,
         "/sys/fs/cgroup/memory/app/memory.limit_in_bytes": f"{256 * MIB}\n",
         "/sys/fs/cgroup/memory/memory.limit_in_bytes": V1_NONE},
        256 * MIB, id="v1"),
    pytest.param(
        {"/proc/self/cgroup": "4:memory:/app\n0::/\n", "/proc/self/mountinfo": MOUNTS_V1,
         "/sys/fs/cgroup/memory/app/memory.limit_in_bytes": V1_NONE,
         "/sys/fs/cgroup/memory/memory.limit_in_bytes": V1_NONE},
        None, id="v1 unlimited"),
    pytest.param(
        {"/proc/self/cgroup": "0::/system.slice/broker.service\n", "/proc/self/mountinfo": MOUNTS_V2,
         "/sys/fs/cgroup/system.slice/broker.service/memory.max": f"{512 * MIB}\n",
         "/sys/fs/cgroup/system.slice/memory.max": "max\n"},
        512 * MIB, id="v2"),
    pytest.param(
        {"/proc/self/cgroup": "0::/system.slice/broker.service\n", "/proc/self/mountinfo": MOUNTS_V2,
         "/sys/fs/cgroup/system.slice/broker.service/memory.max": "max\n",
         "/sys/fs/cgroup/system.slice/memory.max": "max\n"},
        None, id="v2 max = unlimited"),
    pytest.param(
        {"/proc/self/cgroup": "0::/a/b/c\n", "/proc/self/mountinfo": MOUNTS_V2,
         "/sys/fs/cgroup/a/b/c/memory.max": "max\n",
         "/sys/fs/cgroup/a/b/memory.max": f"{300 * MIB}\n",
         "/sys/fs/cgroup/a/memory.max": f"{900 * MIB}\n"},
        300 * MIB, id="nested v2: the smallest ancestor"),
    pytest.param(
        {"/proc/self/cgroup": "4:memory:/outer/inner\n0::/\n", "/proc/self/mountinfo": MOUNTS_V1,
         "/sys/fs/cgroup/memory/outer/inner/memory.limit_in_bytes": f"{512 * MIB}\n",
         "/sys/fs/cgroup/memory/outer/memory.limit_in_bytes": f"{128 * MIB}\n",
         "/sys/fs/cgroup/memory/memory.limit_in_bytes": V1_NONE},
        128 * MIB, id="nested v1: the parent is smaller"),
    pytest.param(
        {"/proc/self/cgroup": "4:memory:/outer/inner\n0::/\n", "/proc/self/mountinfo": MOUNTS_V1,
         "/sys/fs/cgroup/memory/outer/inner/memory.limit_in_bytes": "not a number\n",
         "/sys/fs/cgroup/memory/outer/memory.limit_in_bytes/": None},  # a directory: unreadable as a file
        None, id="unreadable limits are skipped"),
    pytest.param(
        {"/proc/self/cgroup": "4:memory:/outer/inner\n0::/\n", "/proc/self/mountinfo": MOUNTS_V1,
         "/sys/fs/cgroup/memory/outer/inner/memory.limit_in_bytes": "garbage\n",
         "/sys/fs/cgroup/memory/outer/memory.limit_in_bytes": f"{64 * MIB}\n"},
        64 * MIB, id="an unreadable leaf, a readable parent"),
    pytest.param(
        {"/proc/self/cgroup": "4:memory:/docker/abc\n", "/proc/self/mountinfo": MOUNTS_V1_BIND,
         "/sys/fs/cgroup/memory/memory.limit_in_bytes": f"{256 * MIB}\n"},
        256 * MIB, id="v1 bind-mounted container cgroup"),
    pytest.param(
        {"/proc/self/cgroup": "0::/\n", "/proc/self/mountinfo": MOUNTS_V2_SPACE,
         "/cg root/memory.max": f"{32 * MIB}\n"},
        32 * MIB, id="escaped mount point"),
    pytest.param(
        {"/proc/self/cgroup": "4:memory:/app\n0::/\n", "/proc/self/mountinfo": MOUNTS_V1,
         "/sys/fs/cgroup/memory/app/memory.limit_in_bytes": f"{256 * MIB}\n",
         "/sys/fs/cgroup/unified/memory.max": f"{128 * MIB}\n"},
        128 * MIB, id="hybrid: v1 and v2 limits both count"),
    pytest.param({"/proc/self/mountinfo": MOUNTS_V1}, None, id="no /proc/self/cgroup"),
    pytest.param({"/proc/self/cgroup": "4:memory:/app\n", "/proc/self/mountinfo": MOUNTS_V2}, None,
                 id="the memory hierarchy not mounted"),
]


def _tree(root: Path, files: dict[str, str | None]) -> None:
    for path, text in files.items():
        p = root / path.lstrip("/")
        if text is None:
            p.mkdir(parents=True, exist_ok=True)
            continue
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


@pytest.mark.parametrize(("files", "expect"), CASES)
def test_effective_limit(tmp_path: Path, files: dict[str, str | None], expect: int | None) -> None:
    _tree(tmp_path, files)
    assert effective_memory_limit_bytes(str(tmp_path)) == expect


def test_own_cgroup_prefers_v1_memory_then_v2(tmp_path: Path) -> None:
    _tree(tmp_path, {"/proc/self/cgroup": "4:memory:/app\n0::/x\n", "/proc/self/mountinfo": MOUNTS_V1})
    assert own_memory_cgroup(str(tmp_path)) == CgroupDir(1, "/sys/fs/cgroup/memory/app")
    _tree(tmp_path, {"/proc/self/cgroup": "0::/x\n", "/proc/self/mountinfo": MOUNTS_V2})
    assert own_memory_cgroup(str(tmp_path)) == CgroupDir(2, "/sys/fs/cgroup/x")
    _tree(tmp_path, {"/proc/self/cgroup": "1:cpu:/x\n"})
    assert own_memory_cgroup(str(tmp_path)) is None


def test_dirs_go_from_the_cgroup_up_to_the_mount() -> None:
    dirs = memory_cgroup_dirs("4:memory:/a/b\n0::/c\n", MOUNTS_V1)
    assert dirs == [CgroupDir(1, "/sys/fs/cgroup/memory/a/b"), CgroupDir(1, "/sys/fs/cgroup/memory/a"),
                    CgroupDir(1, "/sys/fs/cgroup/memory"), CgroupDir(2, "/sys/fs/cgroup/unified/c"),
                    CgroupDir(2, "/sys/fs/cgroup/unified")]
    assert [d.limit_file for d in dirs[2:4]] == ["/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                                 "/sys/fs/cgroup/unified/c/memory.max"]


def test_a_path_outside_the_mounts_root_falls_back_to_the_mount_point() -> None:
    assert memory_cgroup_dirs("4:memory:/elsewhere\n", MOUNTS_V1_BIND) == [CgroupDir(1, "/sys/fs/cgroup/memory")]


@pytest.mark.parametrize(
    ("text", "expect"),
    [("4:memory:/a\n", {"memory": "/a"}), ("3:cpu,cpuacct:/b\n", {"cpu": "/b", "cpuacct": "/b"}),
     ("0::/c\n", {"": "/c"}), ("1:name=systemd:/d\n", {"name=systemd": "/d"}), ("junk\n", {})],
)
def test_parse_proc_cgroup(text: str, expect: dict[str, str]) -> None:
    assert parse_proc_cgroup(text) == expect


def test_parse_mountinfo_skips_malformed_lines() -> None:
    mounts = parse_mountinfo("garbage\n1 2 3\n" + MOUNTS_V2)
    assert [(m.mount_point, m.fs_type) for m in mounts] == [("/sys/fs/cgroup", "cgroup2")]


@pytest.mark.parametrize(
    ("version", "text", "expect"),
    [(1, "268435456\n", 268435456), (1, V1_NONE, None), (1, str(1 << 62), None), (2, "max\n", None),
     (2, "1073741824", 1 << 30)],
)
def test_parse_limit(version: int, text: str, expect: int | None) -> None:
    assert parse_limit(version, text) == expect


@pytest.mark.parametrize(("version", "text"), [(1, "max"), (2, ""), (1, "12k")])
def test_parse_limit_rejects(version: int, text: str) -> None:
    with pytest.raises(ValueError):
        parse_limit(version, text)
