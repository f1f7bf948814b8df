"""The memory cgroup this process runs in, and the limit it puts on the process's memory (page cache included).

A broker in a container shares its host's RAM but not its page cache: the kernel charges every cached page of
the broker's files to the memory cgroup of the process that first touched it, and reclaims them once the cgroup
reaches its limit. So the memory a broker's reads can count on is the smaller of the host's RAM and that limit.

The cgroup is found as the kernel tells it: ``/proc/self/cgroup`` names the cgroup path of each hierarchy (v1:
``4:memory:/a/b``; v2: ``0::/a/b``), ``/proc/self/mountinfo`` where each hierarchy is mounted and which part of
it the mount shows (its root: a container sees its own cgroup as ``/`` when it has a cgroup namespace, or as the
mount's root when the host's hierarchy is bind-mounted). A limit on any ancestor bounds the cgroup too, so the
effective limit is the smallest one readable from the process's cgroup up to the top of the mounted tree: v1
``memory.limit_in_bytes`` (a value of at least 2**62 means none), v2 ``memory.max`` (``max`` means none). A file
that cannot be read or parsed is skipped; no readable limit at all means unlimited (None).

Parsing is pure (:func:`parse_proc_cgroup`, :func:`parse_mountinfo`, :func:`memory_cgroup_dirs`); the functions
that read take ``root``, the directory the absolute paths are resolved under (``/``; tests pass a tree of
fixture files).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

import attrs

__all__ = [
    "V1_UNLIMITED_FROM",
    "CgroupDir",
    "Mount",
    "effective_memory_limit_bytes",
    "memory_cgroup_dirs",
    "own_memory_cgroup",
    "parse_limit",
    "parse_mountinfo",
    "parse_proc_cgroup",
]

#: v1 reports "no limit" as the largest page count times the page size (9223372036854771712 with 4 KiB pages);
#: anything from 2**62 on is taken as no limit, whatever the page size.
V1_UNLIMITED_FROM = 1 << 62

_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


@attrs.frozen
class Mount:
    """One line of ``/proc/self/mountinfo``, the fields used here."""

    root: str
    """The directory of the mounted file system shown at the mount point (for a cgroup hierarchy: the cgroup)."""
    mount_point: str
    fs_type: str
    super_options: frozenset[str]
    """For a v1 hierarchy, its controllers among the options (``rw,memory``)."""


@attrs.frozen
class CgroupDir:
    """A memory cgroup's directory and the version of its hierarchy."""

    version: int
    """1 or 2."""
    path: str
    """Absolute path of the cgroup's directory."""

    @property
    def limit_file(self) -> str:
        return os.path.join(self.path, "memory.limit_in_bytes" if self.version == 1 else "memory.max")


def _unescape(field: str) -> str:
    return _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """``/proc/self/cgroup`` -> controller -> cgroup path; the v2 hierarchy's entry is under ``""``.

    >>> parse_proc_cgroup("4:memory:/a\\n2:cpu,cpuacct:/b\\n0::/c\\n")
    {'memory': '/a', 'cpu': '/b', 'cpuacct': '/b', '': '/c'}
    """
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hier, controllers, path = parts
        if hier == "0" and controllers == "":
            out[""] = path
            continue
        for c in controllers.split(","):
            if c:
                out[c] = path
    return out


def parse_mountinfo(text: str) -> list[Mount]:
    """The lines of ``/proc/self/mountinfo`` (``id parent major:minor root mount-point options [optional...] -
    fstype source super-options``); malformed lines are skipped."""
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or not tail:
            continue
        options = frozenset(tail[2].split(",")) if len(tail) >= 3 else frozenset()
        mounts.append(Mount(_unescape(fields[3]), _unescape(fields[4]), tail[0], options))
    return mounts


def _under_mount(mount: Mount, cgroup_path: str) -> list[str]:
    """The directories of ``cgroup_path`` and of its ancestors visible under ``mount``, the cgroup's first."""
    root = mount.root.rstrip("/")
    if cgroup_path == root or cgroup_path.startswith(root + "/"):
        rel = cgroup_path[len(root):].strip("/")
    else:  # a path outside what the mount shows (another namespace's view): only the mount's top is known
        rel = ""
    parts = rel.split("/") if rel else []
    return [os.path.join(mount.mount_point, *parts[:n]) for n in range(len(parts), -1, -1)]


def memory_cgroup_dirs(proc_cgroup: str, mountinfo: str) -> list[CgroupDir]:
    """Every directory whose limit bounds this process's memory: the v1 memory cgroup and its ancestors, then the
    v2 cgroup and its ancestors (a hybrid host has both; each may carry a limit), each from the cgroup up."""
    paths = parse_proc_cgroup(proc_cgroup)
    mounts = parse_mountinfo(mountinfo)
    out: list[CgroupDir] = []
    v1 = paths.get("memory")
    if v1 is not None:
        mount = next((m for m in mounts if m.fs_type == "cgroup" and "memory" in m.super_options), None)
        if mount is not None:
            out += [CgroupDir(1, d) for d in _under_mount(mount, v1)]
    v2 = paths.get("")
    if v2 is not None:
        mount = next((m for m in mounts if m.fs_type == "cgroup2"), None)
        if mount is not None:
            out += [CgroupDir(2, d) for d in _under_mount(mount, v2)]
    return out


def parse_limit(version: int, text: str) -> int | None:
    """A limit file's content -> bytes, None for "no limit".

    Raises:
        ValueError: not a number (nor ``max`` in v2).
    """
    value = text.strip()
    if version == 2 and value == "max":
        return None
    n = int(value)
    return None if version == 1 and n >= V1_UNLIMITED_FROM else n


def _read(root: str, path: str) -> str:
    with open(os.path.join(root, path.lstrip("/")), encoding="ascii") as f:
        return f.read()


def own_memory_cgroup(root: str = "/", read: Callable[[str, str], str] = _read) -> CgroupDir | None:
    """This process's own memory cgroup (v1 when the memory controller is mounted there, else v2), or None when
    neither can be found."""
    try:
        dirs = memory_cgroup_dirs(read(root, "/proc/self/cgroup"), read(root, "/proc/self/mountinfo"))
    except (OSError, UnicodeDecodeError):
        return None
    return dirs[0] if dirs else None


def effective_memory_limit_bytes(root: str = "/", read: Callable[[str, str], str] = _read) -> int | None:
    """The smallest memory limit readable on this process's cgroup path, None when there is none (no cgroup
    found, every limit unset or unreadable)."""
    try:
        dirs = memory_cgroup_dirs(read(root, "/proc/self/cgroup"), read(root, "/proc/self/mountinfo"))
    except (OSError, UnicodeDecodeError):
        return None
    best: int | None = None
    for d in dirs:
        try:
            limit = parse_limit(d.version, read(root, d.limit_file))
        except (OSError, ValueError, UnicodeDecodeError):
            continue
        if limit is not None and (best is None or limit < best):
            best = limit
    return best
