"""The three descriptions of the environment agree: pyproject.toml (what the package needs),
constraints.txt (the exact versions) and environment.yml (the same, for conda)."""

from __future__ import annotations

import importlib
import importlib.metadata as metadata
import re
import sys
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from mpgpu_edu.measure import doctor

ROOT = Path(__file__).resolve().parents[1]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def read_constraints(text: str) -> dict[str, str]:
    """``{canonical name: version}`` from ``name==version`` lines; anything else raises."""
    pins = {}
    for line in text.splitlines():
        line = line.split("#")[0].strip()
        if not line:
            continue
        line = line.split(";")[0].strip()  # an environment marker: 'python_version >= "3.11"'
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^=<>~!;\s]+)", line)
        assert match, f"constraints.txt: {line!r} is not an exact pin name==version"
        pins[canonical(match[1])] = match[2]
    return pins


def declared(pyproject: dict, python_version: str) -> dict[str, Requirement]:
    """Runtime and test requirements that apply on ``python_version``."""
    project = pyproject["project"]
    lines = project["dependencies"] + project["optional-dependencies"]["test"]
    requirements = [Requirement(line) for line in lines]
    env = {"python_version": python_version, "python_full_version": f"{python_version}.99"}
    return {canonical(req.name): req for req in requirements
            if req.marker is None or req.marker.evaluate(env)}


def environment_problems(env: dict, pyproject: dict, pins: dict[str, str]) -> list[str]:
    """Every way environment.yml disagrees with pyproject.toml and constraints.txt."""
    conda = [dep for dep in env["dependencies"] if isinstance(dep, str)]
    pythons = [dep.split("=", 1)[1] for dep in conda if dep.startswith("python=")]
    if len(pythons) != 1:
        return [f"environment.yml must pin python once, found {pythons}"]
    (pip,) = [dep["pip"] for dep in env["dependencies"] if isinstance(dep, dict)]
    problems = [f"missing pip entry {entry!r}" for entry in ("-c constraints.txt", "-e .[test]")
                if entry not in pip]
    listed = {canonical(Requirement(line).name): Requirement(line)
              for line in pip if not line.startswith("-")}
    wanted = declared(pyproject, pythons[0])
    for name in sorted(wanted.keys() - listed.keys()):
        problems.append(f"{name} is in pyproject.toml but not in environment.yml")
    for name in sorted(listed.keys() - wanted.keys()):
        problems.append(f"{name} is in environment.yml but not in pyproject.toml")
    for name in sorted(listed.keys() & wanted.keys()):
        pinned = f"=={pins[name]}" if name in pins else "(not in constraints.txt)"
        if str(listed[name].specifier) != pinned:
            problems.append(f"{name}: environment.yml says {listed[name].specifier or 'any'}, "
                            f"constraints.txt says {pinned}")
    return problems


def test_constraints_are_exact_and_pin_torch() -> None:
    pins = read_constraints((ROOT / "constraints.txt").read_text())
    assert pins["torch"] == "2.13.0"
    assert doctor.PINNED_TORCH == pins["torch"]
    assert "mpgpu-edu" not in pins


def test_every_dependency_is_pinned_in_constraints() -> None:
    pins = read_constraints((ROOT / "constraints.txt").read_text())
    missing = [name for name in declared(read_pyproject(), "3.11") if name not in pins]
    assert missing == []


def test_environment_yml_agrees_with_pyproject_and_constraints() -> None:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pins = read_constraints((ROOT / "constraints.txt").read_text())
    assert environment_problems(env, read_pyproject(), pins) == []


def test_the_agreement_check_catches_drift() -> None:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pins = read_constraints((ROOT / "constraints.txt").read_text())
    pip = next(dep["pip"] for dep in env["dependencies"] if isinstance(dep, dict))
    pip[pip.index("torch==2.13.0")] = "torch==2.12.0"
    pip.remove(next(line for line in pip if line.startswith("numpy")))
    pip.append("pandas==2.0.0")
    problems = environment_problems(env, read_pyproject(), pins)
    assert any(p.startswith("torch:") for p in problems), problems
    assert any(p.startswith("numpy is in pyproject") for p in problems), problems
    assert any(p.startswith("pandas is in environment.yml") for p in problems), problems


def test_console_script_is_declared_and_installed() -> None:
    target = read_pyproject()["project"]["scripts"]["mpgpu-edu"]
    assert target == "mpgpu_edu.cli:main"
    module, attribute = target.split(":")
    assert callable(getattr(importlib.import_module(module), attribute))
    installed = metadata.entry_points(group="console_scripts", name="mpgpu-edu")
    assert [entry.value for entry in installed] == [target], \
        "mpgpu-edu is not installed: run `make test` (pip install -c constraints.txt -e '.[test]')"


def test_every_install_goes_through_the_constraints() -> None:
    makefile = (ROOT / "Makefile").read_text()
    installs = [line for line in makefile.splitlines() if "pip install" in line]
    assert installs and all("-c constraints.txt" in line for line in installs), installs
    assert re.search(r"^\s*make test\s*$", (ROOT / ".ci" / "run").read_text(), re.MULTILINE)


def test_the_course_jupyterlab_asks_no_news_question() -> None:
    """``make setup`` writes JupyterLab overrides into the venv: no "Jupyter news?" prompt."""
    import json
    import sys

    if not (Path(sys.prefix) / ".mpgpu-installed").exists():
        pytest.skip("not the course's .venv (made by `make setup`)")
    overrides = Path(sys.prefix) / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
    settings = json.loads(overrides.read_text())["@jupyterlab/apputils-extension:notification"]
    assert settings["fetchNews"] == "false" and settings["checkForUpdates"] is False
