"""The docs' links lead somewhere: the guides are split over several pages, and a
reader who follows a link to a moved section must land on it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "examples/driver-dev/README.md"]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchor(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces
    to hyphens."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    in_code = False
    for line in page.read_text().splitlines():
        if line.lstrip().startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            found.add(anchor(line.lstrip("#")))
    return found


def links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    return [target for target in LINK.findall(text) if "://" not in target]


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_link_of_a_page_reaches_a_file_and_its_section(page: Path) -> None:
    broken = []
    for target in links(page):
        path, _, section = target.partition("#")
        destination = (page.parent / path).resolve() if path else page
        if not destination.exists():
            broken.append(f"{target}: no file {destination.relative_to(ROOT)}")
        elif section and destination.suffix == ".md" and section not in anchors(destination):
            broken.append(f"{target}: no section '{section}' in {destination.relative_to(ROOT)}")
    assert broken == [], f"{page.relative_to(ROOT)}: {broken}"


def test_anchor_is_made_as_github_makes_it() -> None:
    assert anchor(" kind (`make e2e CLUSTER=kind`)") == "kind-make-e2e-clusterkind"
    assert anchor("Identities: as on a real cluster") == "identities-as-on-a-real-cluster"
