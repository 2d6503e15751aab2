"""The README renders on a package index: no link a package index cannot follow.

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


#: what only the project's history knows: issue numbers, paths outside the repository
UNFINISHED = re.compile(r"\b[Ii]ssues? \d+|\ba later issue\b|\.\./shared|/work/shared")


def _product_files() -> list[Path]:
    files = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
             *sorted((REPO / "examples").iterdir()), *sorted((REPO / "hetsched").rglob("*.py"))]
    return [f for f in files if f.is_file()]


def test_docs_and_code_speak_of_the_product_only() -> None:
    hits = [f"{f.relative_to(REPO)}:{n}: {line.strip()}"
            for f in _product_files()
            for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1)
            if UNFINISHED.search(line)]
    assert not hits, "docs/code cite issues or paths outside the repository:\n" + "\n".join(hits)


def test_the_unfinished_check_sees_what_it_must() -> None:
    for bad in ("Issue 14; paper", "(issue 3)", "issues 11.6/11.7", "of a later issue",
                "`../shared/papers/x.txt`"):
        assert UNFINISHED.search(bad), bad
    assert not UNFINISHED.search("reissue 3 jobs; the tissue")


def test_help_cites_no_document_the_wheel_does_not_install() -> None:
    """The wheel installs no docs/: ``--help`` must carry what it refers a user to."""
    import click
    from click.testing import CliRunner

    from hetsched.cli.main import main

    def walk(cmd: click.Command, path: list[str]) -> list[list[str]]:
        subs = getattr(cmd, "commands", {})
        return [path] + [p for name, sub in sorted(subs.items()) for p in walk(sub, path + [name])]

    runner = CliRunner()
    cited = {}
    for path in walk(main, []):
        out = runner.invoke(main, [*path, "--help"]).output
        if re.search(r"\bdocs/|\.md\b", out):
            cited[" ".join(path) or "hetsched"] = out
    assert not cited, f"--help names documents the wheel lacks: {sorted(cited)}"
    top = runner.invoke(main, ["--help"]).output
    assert "Exit codes:" in top and "Slurm did not answer" in top
