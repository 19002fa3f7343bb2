"""The README's command lines are ones the tool takes: people paste them.

Every `testbed ...` line in the README's shell blocks is parsed by the CLI as it is
(subcommand, options, their types and argument count); the profiles and scenarios they
name are shipped ones; every `make` target and variable they use is in the Makefile; and
the CLI's help lists the profiles and scenarios that ship.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

from testbed import cli
from testbed.drivers import PROFILES
from testbed.scenarios import spec as scenario_spec

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


@dataclass(frozen=True)
class Shown:
    line: int
    words: list[str]

    def __str__(self) -> str:
        return f"README.md:{self.line}: {shlex.join(self.words)}"


def shell_commands(text: str, program: str) -> list[Shown]:
    """The commands of ``program`` in the shell (or untyped) fenced blocks, continuation
    lines joined, comments and a leading ``$ `` dropped."""
    found: list[Shown] = []
    in_block = in_shell = False
    pending: tuple[int, str] | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        fence = re.match(r"^\s*```(\w*)", line)
        if fence:
            in_block = not in_block
            in_shell = in_block and fence.group(1) in ("", "bash", "sh", "console", "shell")
            pending = None
            continue
        if not in_shell:
            continue
        if pending is not None:
            start, joined = pending
            line = joined + " " + line.strip()
            number = start
        if line.rstrip().endswith("\\"):
            pending = (number, line.rstrip()[:-1])
            continue
        pending = None
        stripped = re.sub(r"^\s*\$\s+", "", line).strip()
        for command in re.split(r"\s*(?:&&|;)\s*", stripped):
            if not command.startswith(program + " "):
                continue
            words = shlex.split(command, comments=True)
            found.append(Shown(number, words[1:]))
    return found


TESTBED_LINES = shell_commands(README.read_text(), "testbed")
MAKE_LINES = shell_commands(README.read_text(), "make")


def test_the_readme_shows_commands_of_both_kinds() -> None:
    """So the checks below cannot pass by finding nothing."""
    assert len(TESTBED_LINES) >= 40, [str(s) for s in TESTBED_LINES]
    assert len(MAKE_LINES) >= 3, [str(s) for s in MAKE_LINES]


def _parse(words: list[str]) -> tuple[str, click.Context]:
    group = cli.main
    with group.make_context("testbed", list(words), resilient_parsing=False) as top:
        name, command, rest = group.resolve_command(top, top._protected_args + top.args)
        assert command is not None and name is not None
        return name, command.make_context(name, rest, parent=top)


@pytest.mark.parametrize("shown", TESTBED_LINES, ids=str)
def test_a_testbed_command_the_readme_shows_is_accepted_as_written(shown: Shown) -> None:
    try:
        name, ctx = _parse(shown.words)
    except click.BadParameter as exc:
        if isinstance(exc.param and exc.param.type, click.Path) and "does not exist" in exc.format_message():
            return  # the user's own file (fleet.yaml, a run's report): parsed up to its lookup
        pytest.fail(f"{shown}\n  the CLI refuses it: {exc.format_message()}")
    except click.ClickException as exc:
        pytest.fail(f"{shown}\n  the CLI refuses it: {exc.format_message()}")
    profile = ctx.params.get("profile")
    if profile is not None and not str(profile).endswith((".yaml", ".yml")):
        assert profile in PROFILES.shipped(), f"{shown}\n  no profile {profile!r} ships"
    if name == "run":
        scenario = ctx.params["scenario"]
        if not str(scenario).endswith((".yaml", ".yml")):
            assert scenario in scenario_spec.shipped(), f"{shown}\n  no scenario {scenario!r} ships"


def _makefile() -> tuple[set[str], set[str]]:
    text = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([A-Za-z][\w-]*):", text, re.MULTILINE))
    variables = set(re.findall(r"^([A-Z][A-Z_]*)\s*\??=", text, re.MULTILINE))
    variables |= set(re.findall(r"\$\(([A-Z][A-Z_]*)\)", text))
    variables |= set(re.findall(r"\$\(if \$\(([A-Z][A-Z_]*)\)", text))
    variables |= set(re.findall(r"\$\(filter [^,]+,\$\(([A-Z][A-Z_]*)\)\)", text))
    return targets, variables


@pytest.mark.parametrize("shown", MAKE_LINES, ids=str)
def test_a_make_command_the_readme_shows_names_a_target_and_variables_the_makefile_has(shown: Shown) -> None:
    targets, variables = _makefile()
    for word in shown.words:
        if "=" in word:
            variable = word.split("=", 1)[0]
            assert variable in variables, f"{shown}\n  the Makefile reads no {variable}"
        else:
            assert word in targets, f"{shown}\n  the Makefile has no target {word!r}"


def _help(command: str, parameter: str) -> str:
    found = cli.main.get_command(click.Context(cli.main), command)
    assert found is not None
    if parameter == "":
        return found.help or ""
    for param in found.params:
        if param.name == parameter and isinstance(param, click.Option):
            return param.help or ""
    raise AssertionError(f"testbed {command} has no {parameter}")


def test_the_cli_help_names_every_shipped_profile_and_scenario() -> None:
    profiles_help = _help("up", "profile")
    assert [p for p in PROFILES.shipped() if p not in profiles_help] == [], profiles_help
    run_help = _help("run", "")
    assert [s for s in scenario_spec.shipped() if s not in run_help] == [], run_help
