"""The README renders on a package index (issue 16): no link a package index cannot follow.

A package index shows README.md as the project's description, away from the
repository, so a relative link (``[x](docs/x.md)``) is broken there. Links
must be absolute (``https://...``) or anchors; documents are named as paths
in code spans instead, and the source distribution carries ``docs/``
(MANIFEST.in).
"""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)[^)]*\)|<(?:a|img)\s[^>]*(?:href|src)=\"([^\"]+)\"")


def _targets(text: str) -> list[str]:
    return [m.group(1) or m.group(2) for m in LINK.finditer(text)]


def test_readme_has_no_relative_links() -> None:
    bad = [t for t in _targets((REPO / "README.md").read_text())
           if not t.startswith(("https://", "http://", "mailto:", "#"))]
    assert not bad, f"README.md links a package index cannot follow: {bad}"


def test_the_check_sees_relative_links() -> None:
    assert _targets("see [cli](docs/cli.md) and ![g](img/g.png)") == ["docs/cli.md", "img/g.png"]
    assert _targets('<a href="docs/x.md">x</a>') == ["docs/x.md"]


def test_sdist_carries_the_documents_the_readme_names() -> None:
    manifest = (REPO / "MANIFEST.in").read_text().split()
    assert "docs" in manifest
    named = set(re.findall(r"`(docs/[\w./-]+)`", (REPO / "README.md").read_text()))
    assert named, "the README names its documents"
    missing = sorted(n for n in named if not (REPO / n).exists())
    assert not missing, f"README.md names documents that do not exist: {missing}"
