"""The documentation: the MkDocs site builds without a warning (``--strict``: broken links,
missing anchors, pages left out of the nav, API pages that do not render), the README stays
short, and nothing users get points to files outside the repository."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]

README_MAX_LINES = 200

# Pointers to the team's own folder, which is not shipped with dpclip: notes, paper copies and
# dataset files that a user of the repository does not have.
FORBIDDEN = ("METHODS.md", "../shared", "papers/")


def test_the_site_builds_without_a_warning(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
         str(PROJECT / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
        cwd=PROJECT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "index.html").is_file()
    for page in ("methods", "privacy", "attacks", "measurements", "api/methods"):
        assert (tmp_path / "site" / page / "index.html").is_file(), page


def test_the_readme_is_at_most_200_lines():
    lines = (PROJECT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines; move detail to docs/ (at most {README_MAX_LINES})")


def shipped_files() -> list[Path]:
    """README.md, the docs' pages and scripts, params.yaml, the tests (but this one, which names
    the pointers), and everything in src/, flows/ and presets/."""
    files = [PROJECT / "README.md", PROJECT / "params.yaml", PROJECT / "mkdocs.yml"]
    files += sorted(p for p in (PROJECT / "docs").rglob("*") if p.suffix in (".md", ".py"))
    files += sorted(p for p in (PROJECT / "tests").rglob("*.py") if p.name != "test_docs.py")
    for folder in ("src", "flows", "presets"):
        files += sorted(p for p in (PROJECT / folder).rglob("*") if p.is_file()
                        and not any(part.endswith(".egg-info") or part == "__pycache__"
                                    for part in p.relative_to(PROJECT).parts))
    return files


def forbidden_pointers(path: Path) -> list[str]:
    relative = path.relative_to(PROJECT).as_posix()
    found = []
    for number, line in enumerate(path.read_text(errors="ignore").splitlines(), 1):
        if any(word in line for word in FORBIDDEN):
            found.append(f"{relative}:{number}: {line.strip()}")
    return found


def test_nothing_points_outside_the_repository():
    files = shipped_files()
    assert PROJECT / "src" / "dpclip" / "tools" / "presets.py" in files
    found = [hit for path in files for hit in forbidden_pointers(path)]
    assert not found, "pointers to files users do not have:\n" + "\n".join(found)


def test_the_pointer_check_finds_a_pointer(tmp_path, monkeypatch):
    """The check itself: a pointer to the team's notes, to a paper copy or to the shared
    folder is found."""
    monkeypatch.setattr(sys.modules[__name__], "PROJECT", tmp_path)
    (tmp_path / "src" / "dpclip").mkdir(parents=True)
    (tmp_path / "src" / "dpclip" / "x.py").write_text(
        '"""The rule (METHODS.md, step 1)."""\n# see papers/a.txt\nPATH = "../shared/x"\n')
    assert len(forbidden_pointers(tmp_path / "src" / "dpclip" / "x.py")) == 3


def test_the_layout_table_names_every_top_level_module_and_package():
    """docs/development.md's layout table once left out 16 of 23 top-level modules."""
    text = (PROJECT / "docs" / "development.md").read_text()
    table = text[text.index("## Layout"):text.index("### Imports")]
    package = PROJECT / "src" / "dpclip"
    missing = [p.name for p in sorted(package.iterdir())
               if (p.suffix == ".py" or (p / "__init__.py").exists())
               and not re.search(rf"`(src/dpclip/)?{re.escape(p.name)}/?`", table)]
    assert not missing, f"docs/development.md's layout table leaves out {missing}"


# a pointer from the code to the docs: docs/<page>.md, "<heading>" (a docstring may wrap it)
POINTER = re.compile(r'docs/([a-z_/-]+\.md),\s*(?:#\s*)?"([^"]+)"')


def pointers(text: str) -> list[tuple[str, str]]:
    """(page, heading) of every pointer in ``text``, a heading wrapped over lines joined and
    its code marks left out, as the docstrings write them."""
    return [(page, " ".join(heading.replace("`", "").split()))
            for page, heading in POINTER.findall(text)]


def headings(page: Path) -> set[str]:
    return {line.lstrip("#").strip().replace("`", "") for line in page.read_text().splitlines()
            if line.startswith("#")}


def test_every_pointer_from_the_code_names_a_heading_of_its_page():
    """The code's long explanations live in the docs, and its docstrings point to them by page
    and heading: a heading renamed or shortened would leave a reader looking for it."""
    broken = []
    for path in (PROJECT / "src").rglob("*.py"):
        for page, heading in pointers(path.read_text()):
            target = PROJECT / "docs" / page
            if not target.is_file() or heading not in headings(target):
                broken.append(f"{path.relative_to(PROJECT)}: docs/{page}, {heading!r}")
    assert broken == []


def test_the_pointer_check_finds_a_wrapped_pointer():
    assert pointers('see docs/privacy.md, "The DP\n    step" and docs/a.md, "B"') == \
        [("privacy.md", "The DP step"), ("a.md", "B")]
