"""The command lines and YAML the docs show are ones the tool takes: people paste them.

Every `testbed ...` line in the shell blocks of README.md and docs/ is parsed by the CLI
as it is (subcommand, options, their types and argument count); the profiles and
scenarios they name are shipped ones; every `make` target and variable they use is in
the Makefile; the CLI's help lists the profiles and scenarios that ship; and each YAML
block of the README and docs/ validates as the fleet file, scenario part or opaque
device config it shows.
"""

from __future__ import annotations

import re
import shlex
import typing
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
import yaml

from fake_devices.specfiles import validate
from testbed import cli
from testbed.drivers import KINDS, PROFILES
from testbed.fleet import spec as fleet_spec
from testbed.fleet.fleet import FAULT_ACTIONS
from testbed.kubeletplugin.opaque_config import parse_config
from testbed.scenarios import spec as scenario_spec

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@dataclass(frozen=True)
class Shown:
    where: str
    words: list[str]

    def __str__(self) -> str:
        return f"{self.where}: {shlex.join(self.words)}"


def shell_commands(text: str, program: str, source: str = "README.md") -> list[Shown]:
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
            found.append(Shown(f"{source}:{number}", words[1:]))
    return found


TESTBED_LINES = [
    s for doc in DOCS for s in shell_commands(doc.read_text(), "testbed", doc.relative_to(ROOT).as_posix())
]
MAKE_LINES = [s for doc in DOCS for s in shell_commands(doc.read_text(), "make", doc.relative_to(ROOT).as_posix())]


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


def yaml_blocks(text: str) -> list[tuple[int, str]]:
    """(first line, text) of each ```yaml block."""
    blocks: list[tuple[int, str]] = []
    lines = text.splitlines()
    number = 0
    while number < len(lines):
        if lines[number].strip() == "```yaml":
            end = next(i for i in range(number + 1, len(lines)) if lines[i].strip() == "```")
            blocks.append((number + 2, "\n".join(lines[number + 1 : end])))
            number = end
        number += 1
    return blocks


YAML_BLOCKS = [(f"{doc.relative_to(ROOT)}:{line}", text) for doc in DOCS for line, text in yaml_blocks(doc.read_text())]


def _validate_yaml_block(text: str, source: str) -> str:
    """Validate one block as what it shows; what it was taken for."""
    documents = [d for d in yaml.safe_load_all(text) if d is not None]
    if all("apiVersion" in d for d in documents):
        for document in documents:
            driver = str(document["apiVersion"]).split("/")[0]
            kind = KINDS[driver]
            parse_config(driver, document, kind.configs)
        return "opaque configs"
    (document,) = documents
    if "pools" in document:
        fleet_spec.parse(text, source)
        return "fleet file"
    if set(document) <= {"phases", "faults", "cluster", "description", "sloP99Seconds"}:
        scenario: dict[str, object] = {"name": "readme", "phases": [{"name": "one", "jobs": 1}], **document}
        validate(scenario_spec.Scenario, scenario, "scenario", source, scenario_spec.ScenarioError)
        return "scenario"
    raise AssertionError(f"{source}: a YAML block this test does not know how to check: keys {sorted(document)}")


@pytest.mark.parametrize(("where", "text"), YAML_BLOCKS, ids=[where for where, _ in YAML_BLOCKS])
def test_a_yaml_block_the_docs_show_is_valid_as_what_it_shows(where: str, text: str) -> None:
    _validate_yaml_block(text, where)


def test_the_docs_show_yaml_of_every_kind_they_document() -> None:
    taken = {_validate_yaml_block(text, where) for where, text in YAML_BLOCKS}
    assert taken == {"opaque configs", "fleet file", "scenario"}


def test_every_fault_is_in_the_cli_help_the_readme_and_scenarios() -> None:
    """`testbed fault`'s help and the docs' list of faults name each one it takes;
    a scenario's faults take each one too, besides its own (rollout, taint-rule)."""
    fault_help = _help("fault", "")
    docs = "".join(doc.read_text() for doc in DOCS)
    assert [a for a in FAULT_ACTIONS if a not in fault_help] == [], fault_help
    shown = {s.words[2] for s in TESTBED_LINES if s.words[0] == "fault" and len(s.words) > 2}
    assert set(FAULT_ACTIONS) <= shown, f"faults the docs never show: {set(FAULT_ACTIONS) - shown}"
    in_scenarios = set(typing.get_args(scenario_spec.Fault.model_fields["action"].annotation))
    assert set(FAULT_ACTIONS) - {"clear"} <= in_scenarios, "a scenario undoes its own faults; every other one it takes"
    assert all(f"action: {a}" in docs for a in in_scenarios - set(FAULT_ACTIONS)), in_scenarios
