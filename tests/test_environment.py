"""The environment is the lock: requirements.txt (generated from requirements.in by `make lock`) pins every
package, and the venv the tests run in holds exactly those versions."""

import re
import subprocess
import sys

from tests.conftest import ROOT


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(text: str) -> dict[str, str]:
    """`name==version` lines -> {canonical name: version}; comments and `# via` lines left out."""
    found = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep, f"not pinned to one version: {line!r}"
            found[canonical(name)] = version
    return found


def test_the_venv_holds_exactly_the_lock():
    frozen = subprocess.run(
        [sys.executable, "-m", "pip", "freeze", "--all", "--exclude-editable"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    installed = pins(frozen)
    installed.pop("pip")  # the installer itself
    lock = pins((ROOT / "requirements.txt").read_text())
    differ = {n: (installed.get(n), lock.get(n)) for n in set(installed) | set(lock) if installed.get(n) != lock.get(n)}
    assert not differ, f"installed vs requirements.txt (make env installs the lock): {differ}"


def test_every_direct_requirement_is_met_by_the_lock():
    """requirements.in may give a range (setuptools>=64); the lock's one version must meet it."""
    from packaging.requirements import Requirement

    lock = pins((ROOT / "requirements.txt").read_text())
    lines = [line.split("#", 1)[0].strip() for line in (ROOT / "requirements.in").read_text().splitlines()]
    direct = [Requirement(line) for line in lines if line]
    unmet = [str(r) for r in direct if not r.specifier.contains(lock.get(canonical(r.name), "0"), prereleases=True)]
    assert "psutil" in {canonical(r.name) for r in direct}  # imported by scripts/pipeline/measure.py
    assert not unmet, f"requirements.txt does not meet {unmet}: run make lock"
