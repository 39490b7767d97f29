"""Temp files of uploads in progress, named after the process that writes them.

A gateway killed mid-upload (kill -9, OOM) leaves its temp file behind. Several gateways may
share one data dir, so a gateway starting up removes only the files it can prove orphaned:
written by a process of this host that no longer runs, or untouched for a day (files of other
hosts, or of names from before this scheme).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import socket
import time
import uuid
from pathlib import Path

log = logging.getLogger("stitchsim.service")

ORPHAN_AGE_S = 24 * 3600  # an upload that did not write a byte for a day is dead, wherever
_NAME = re.compile(r"^upload-(?P<host>[0-9a-f]{12})-(?P<pid>\d+)-[0-9a-f]{32}\.part$")


def _host_tag() -> str:
    # Hashed: host names may hold dashes and dots, which would make the name ambiguous.
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:12]


def new_upload_path(tmp_dir: Path) -> Path:
    return tmp_dir / f"upload-{_host_tag()}-{os.getpid()}-{uuid.uuid4().hex}.part"


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        # Called at start-up, before this process received anything: a file with our pid was
        # left by an earlier process that had it (a restarted container reuses its pids).
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _orphaned(path: Path, host: str) -> bool:
    try:
        idle = time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return False
    if idle > ORPHAN_AGE_S:
        return True
    m = _NAME.match(path.name)
    return m is not None and m["host"] == host and not _pid_alive(int(m["pid"]))


def remove_orphaned_uploads(tmp_dir: Path) -> list[Path]:
    """Remove the temp files of dead uploads (call at start-up); returns what was removed."""
    host = _host_tag()
    removed = []
    for path in tmp_dir.glob("upload-*.part"):
        if _orphaned(path, host):
            path.unlink(missing_ok=True)
            removed.append(path)
    if removed:
        log.info("removed %d temp files of uploads cut short by a dead gateway", len(removed))
    return removed
