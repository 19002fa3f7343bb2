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


def test_joining_ray_keeps_this_processs_exception_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray's hook reports an uncaught exception to the cluster first and blocks for ever
    when the cluster is gone (`testbed down` during `testbed up` left `up` hanging)."""
    import sys

    def own(*_: object) -> None:
        return None

    monkeypatch.setattr(sys, "excepthook", own)
    with raycluster._own_handlers_kept():
        sys.excepthook = lambda *_: None  # what ray.init does
    assert sys.excepthook is own


def test_an_error_of_rays_is_one_line_with_the_likely_cause(capsys: pytest.CaptureFixture[str]) -> None:
    from testbed import cli

    class ActorDiedError(Exception):
        __module__ = "ray.exceptions"

    @cli.reports_errors
    def command() -> None:
        raise ActorDiedError("The actor died unexpectedly before finishing this task.\n\tclass_name: NodeHost")

    with pytest.raises(SystemExit) as exit_:
        command()
    err = capsys.readouterr().err
    assert exit_.value.code == 1
    assert "error: Ray: The actor died unexpectedly before finishing this task." in err
    assert "testbed down" in err and "class_name" not in err

    @cli.reports_errors
    def ours() -> None:
        raise ValueError("a bug of ours")

    with pytest.raises(ValueError, match="a bug of ours"):  # not taken for Ray's
        ours()
