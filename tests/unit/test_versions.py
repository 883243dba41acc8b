"""The version moves in one piece: pyproject.toml, the package and CHANGELOG.md agree, and
the previous release names a commit of this repository's history."""

from __future__ import annotations

import shutil
import subprocess
import tomllib

import pytest

import conveyor
from support.releases import ROOT, previous_release, releases


def test_pyproject_package_and_changelog_agree() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert conveyor.__version__ == declared
    assert releases()[0].version == declared, "the topmost CHANGELOG release is the one under way"


def test_versions_only_go_up() -> None:
    versions = [tuple(int(p) for p in r.version.split(".")) for r in releases()]
    assert versions == sorted(versions, reverse=True)
    assert len(set(versions)) == len(versions)


def test_the_previous_release_is_a_commit_of_this_history() -> None:
    previous = previous_release()
    assert previous.commit is not None
    assert previous.version != conveyor.__version__
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    argv = ["git", "-C", str(ROOT), "merge-base", "--is-ancestor", previous.commit, "HEAD"]
    found = subprocess.run(argv, capture_output=True, check=False)
    assert found.returncode == 0, f"{previous.commit} is not an ancestor of HEAD: {found.stderr.decode()}"
