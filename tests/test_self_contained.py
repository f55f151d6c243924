"""The repository stands alone: no tracked file points at a path outside it.

Everything the product, its tests and its docs use ships in the repository (the hardware reference is
``hardware_models/reference/hardware_specs.yaml``, the notes are under ``docs/reference/``). A line that
cites a sibling checkout (a parent-relative path into a shared folder), the machine this was developed
on, or someone's home directory dangles on a user's clone. Provenance notes may say where material came
from, in words, without such a path. A home-relative default such as ``~/.cache/tiersim`` is a path on
the user's own machine and is allowed.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Written with a character class so that this file does not match its own patterns.
OUTSIDE = {
    "parent-relative path to a shared folder": re.compile(r"\.\./share[d]\b"),
    "absolute path into the development machine's work tree": re.compile(r"(?<![\w.-])/wor[k]/"),
    "absolute home directory": re.compile(r"(?<![\w.-])/(?:hom[e]/[\w.-]+|User[s]/[\w.-]+|roo[t])/"),
}
# Trees that are not the project's own text, should the walk (no git) meet them.
_SKIP_DIRS = {".git", ".venv", "venv", "build", "dist", "__pycache__", ".pytest_cache", ".hypothesis", ".mypy_cache",
              ".ruff_cache", ".benchmarks", "out"}


def _project_files() -> list[Path]:
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):  # not a git checkout (an unpacked sdist): walk the tree
        return sorted(
            p for p in ROOT.rglob("*")
            if p.is_file() and not _SKIP_DIRS.intersection(p.relative_to(ROOT).parts)
            and not any(part.endswith(".egg-info") for part in p.relative_to(ROOT).parts)
        )
    return sorted(ROOT / name for name in listed.decode().split("\0") if name and (ROOT / name).is_file())


def _text(path: Path) -> str | None:
    data = path.read_bytes()
    if b"\0" in data:  # binary (figures)
        return None
    return data.decode("utf-8", errors="replace")


def outside_references(files: list[Path], root: Path = ROOT) -> list[str]:
    """``path:line: what: text`` for every line of `files` (under `root`) that names a path outside it."""
    found = []
    for path in files:
        text = _text(path)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            for what, pattern in OUTSIDE.items():
                if pattern.search(line):
                    found.append(f"{path.relative_to(root).as_posix()}:{number}: {what}: {line.strip()[:160]}")
    return found


def test_the_scan_sees_code_presets_tests_and_docs() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in _project_files()}
    assert {"README.md", "docs/design.md", "hardware_models/presets/a100x8.yaml", "workloads/presets/models.yaml",
            "hardware_models/reference/hardware_specs.yaml", "tests/test_self_contained.py"} <= names
    assert any(n.startswith("policies/") and n.endswith(".py") for n in names)


def test_the_patterns_catch_what_they_are_for(tmp_path: Path) -> None:
    bad = tmp_path / "bad.md"
    bad.write_text(
        "see ../" + "sha" + "red/design.md\n"
        "copied from /" + "work/sha" + "red/reference/hardware_specs.yaml\n"
        "a checkout in /" + "home/alice/src\n"
        "a checkout in /" + "Users/bob/src\n"
        "fine: ~/.cache/tiersim, https://example.org/network/x, docs/reference/policies.md\n"
    )
    found = outside_references([bad], root=tmp_path)
    assert [line.split(":")[:2] for line in found] == [["bad.md", "1"], ["bad.md", "2"], ["bad.md", "3"],
                                                       ["bad.md", "4"]]


def test_no_tracked_file_refers_to_a_path_outside_the_repository() -> None:
    found = outside_references(_project_files())
    assert not found, "paths outside the repository (cite the in-repo copy instead):\n" + "\n".join(found)
