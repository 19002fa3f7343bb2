"""What Ray prints on a testbed command's terminal."""

from __future__ import annotations

import pytest

from testbed.fleet import raycluster

RAYLET_WARNING = (
    "WARNING: 24 PYTHON worker processes have been started on node: 0123 with address: 127.0.0.1. "
    "This could be a result of using a large number of actors, or due to tasks blocked in ray.get() calls"
)


def test_the_raylets_warning_about_many_workers_is_kept_off_the_terminal_and_the_rest_passes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from ray._private import worker

    monkeypatch.setattr(worker, "print_to_stdstream", worker.print_to_stdstream)
    raycluster.quiet_misleading_warnings()
    raycluster.quiet_misleading_warnings()  # a second join does not stack filters

    worker.print_to_stdstream({"lines": [RAYLET_WARNING], "pid": "raylet", "is_err": False}, ignore_prefix=False)
    assert capsys.readouterr().out == ""
    worker.print_to_stdstream(
        {"lines": [RAYLET_WARNING, "the object store is full"], "pid": "raylet", "is_err": False}, ignore_prefix=False
    )
    out = capsys.readouterr().out
    assert "the object store is full" in out
    assert "worker processes" not in out
