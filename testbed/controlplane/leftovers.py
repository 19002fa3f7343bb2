"""Namespaces a scenario run could not delete because the API server was gone.

`testbed run` notes them in ``DIR/left-behind.json``; the cluster's supervisor, which
brings the API server back, deletes them once it answers again, and forgets each one the
API server has taken (or no longer has). ``testbed status`` lists those still waiting.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from contextlib import AbstractContextManager
from pathlib import Path

from testbed import locks
from testbed.files import write_atomically
from testbed.kubeapi import credentials_from_kubeconfig, path_for

FILE = "left-behind.json"
log = logging.getLogger(__name__)


def _locked(root: Path) -> AbstractContextManager[None]:
    """A run adding and the supervisor removing never lose each other's change."""
    return locks.held(root / f"{FILE}.lock")


def pending(root: Path) -> list[str]:
    try:
        names = json.loads((root / FILE).read_text())
    except (OSError, ValueError):
        return []
    return [str(n) for n in names] if isinstance(names, list) else []


def _write(root: Path, names: list[str]) -> None:
    write_atomically(root / FILE, json.dumps(sorted(set(names))).encode(), durable=False)


def remember(root: Path, namespace: str) -> None:
    with _locked(root):
        _write(root, [*pending(root), namespace])


def forget(root: Path, namespaces: list[str]) -> None:
    with _locked(root):
        _write(root, [n for n in pending(root) if n not in namespaces])


def delete_pending(root: Path, timeout_s: float = 5.0) -> list[str]:
    """Ask the API server to delete each namespace still noted; returns those it took.
    One that cannot be asked now (the server still down) stays for the next time."""
    names = pending(root)
    if not names:
        return []
    credentials = credentials_from_kubeconfig(root / "kubeconfig")
    done = []
    for name in names:
        request = urllib.request.Request(credentials.server + path_for("v1", "namespaces", name), method="DELETE")
        try:
            with urllib.request.urlopen(request, context=credentials.ssl_context, timeout=timeout_s):
                done.append(name)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                done.append(name)  # gone already
            else:
                log.warning("deleting namespace %s: HTTP %s", name, exc.code)
        except (urllib.error.URLError, OSError):
            break  # the API server is not answering: try them all again later
    if done:
        forget(root, done)
    return done
