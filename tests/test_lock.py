"""The lock: every package the tests and the bits depend on is pinned.

The bit-level facts the project rests on (which forwards agree bit for bit,
which bounds hold) are facts of torch, transformers, llama.cpp and numpy at
one version each. A fresh clone must install those versions, not whatever
PyPI serves that day, so the Makefile installs through constraints/*.txt
(made by ``make lock``). These checks fail when a dependency is added or
changed in pyproject.toml without re-locking, and when the Makefile stops
installing through the lock.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: The lock each venv is installed through, and the extras that venv takes
#: (the Makefile's install lines).
LOCKS = {"constraints/main.txt": ("dev", "plot", "eval", "test", "langgraph"),
         "constraints/vllm.txt": ("dev", "eval", "vllm"),
         "constraints/conform.txt": ("dev", "langgraph", "agents", "adk", "mem0")}
#: the agent clients' venvs (bench/serve_agents.py): an extra each, installed without unsee
CLIENT_LOCKS = {"constraints/clients.txt": "clients", "constraints/llamaindex.txt": "clients-llamaindex"}


def get_name(requirement: str) -> str:
    """The normalised distribution name of a requirement or a pin."""
    return re.sub(r"[-_.]+", "-", re.split(r"[\s<>=!~;\[@]", requirement.strip(), maxsplit=1)[0]).lower()


def get_pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep, f"{path.name}: {line!r} is not an exact pin"
            pins[get_name(name)] = version
    return pins


def get_requirements(extras: tuple[str, ...]) -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    optional = project["optional-dependencies"]
    return project["dependencies"] + [r for extra in extras for r in optional[extra]]


@pytest.mark.parametrize("lock", sorted(LOCKS))
def test_every_dependency_is_pinned(lock):
    path = ROOT / lock
    if not path.exists():
        pytest.fail(f"{lock} is missing: run `make lock`")
    pins = get_pins(path)
    missing = sorted({get_name(r) for r in get_requirements(LOCKS[lock])} - set(pins))
    assert not missing, f"{lock} pins none of {missing}: run `make lock` after changing pyproject.toml"
    # the packages whose bits the facts are measured on
    for name in ("torch", "transformers", "numpy", "hypothesis"):
        assert name in pins, f"{lock} does not pin {name}"


def test_make_installs_through_the_lock():
    makefile = (ROOT / "Makefile").read_text()
    installs = [line for line in makefile.splitlines() if re.search(r"\$\((PY|VLLM_PY|CONFORM_PY|PEER_PY|CLIENTS_PY|LLAMAINDEX_PY)\) -m pip install", line)]
    assert installs
    unpinned = [line.strip() for line in installs if "$(PIP_C" not in line]
    assert not unpinned, f"installs that bypass the lock: {unpinned}"


def test_peer_lock_agrees_with_main():
    """The peer benchmark's venv (bench/serve_peer.py: llama-cpp-python's own
    server) is pinned whole, runs the llama-cpp-python the project pins, and
    shares every package it has in common with the main lock at that lock's version."""
    peer, main = get_pins(ROOT / "constraints/peer.txt"), get_pins(ROOT / "constraints/main.txt")
    llamacpp = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["llamacpp"]
    pinned = dict(r.split("==") for r in llamacpp)
    assert peer["llama-cpp-python"] == pinned["llama-cpp-python"]
    for name in ("fastapi", "uvicorn", "sse-starlette", "pydantic-settings", "starlette-context"):
        assert name in peer, f"constraints/peer.txt does not pin the server extra's {name}"
    differ = {name: (peer[name], main[name]) for name in sorted(set(peer) & set(main)) if peer[name] != main[name]}
    assert not differ, f"constraints/peer.txt and constraints/main.txt pin these differently: {differ}"
    spec = re.search(r"^PEER_SPEC \?= (\S+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert spec and spec.group(1) == f"llama-cpp-python[server]=={pinned['llama-cpp-python']}"


@pytest.mark.parametrize("lock", sorted(LOCKS) + ["constraints/peer.txt"] + sorted(CLIENT_LOCKS))
def test_no_pin_names_a_local_build(lock):
    """A pin such as ``torch==2.13.0+cpu`` resolves only where an index serves
    that local build; PyPI has none, so a stock machine could not install the
    lock. ``==2.13.0`` matches the local build where one is offered (PEP 440)."""
    local = sorted(f"{name}=={version}" for name, version in get_pins(ROOT / lock).items() if "+" in version)
    assert not local, f"{lock} pins local builds PyPI does not serve: {local} (make lock drops the label)"


@pytest.mark.parametrize("lock", sorted(CLIENT_LOCKS))
def test_client_locks_pin_their_extra(lock):
    """The agent clients' venvs (``make serve-agents``) take one extra each, without unsee
    (whose dependencies bring torch): the lock pins each of its requirements at the
    extra's own version, and the Makefile installs that extra through it."""
    extra = CLIENT_LOCKS[lock]
    pins = get_pins(ROOT / lock)
    optional = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for requirement in optional[extra]:
        name, _, version = requirement.partition("==")
        assert version, f"the {extra} extra's {requirement!r} is not an exact pin"
        assert pins.get(get_name(name)) == version, f"{lock} pins {get_name(name)} at {pins.get(get_name(name))}, " \
                                                    f"the {extra} extra at {version}: run `make lock`"
    assert "torch" not in pins and "unsee" not in pins
    assert f"$(call get_extra,{extra})" in (ROOT / "Makefile").read_text()
