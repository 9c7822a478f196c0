"""Tuning profiles on disk, outside the backend-agnostic engines/speculative (the engine hosts
read the one a run names, `for_spec`, and hand it to its schedule): what
`specscope tune` measured on this machine for one model and drafter (its latency curve by
width, drafting cost and acceptance by position), which `--steps auto` (speculative/tuning.py's
AutoSteps) and the batch controller start from. A profile is JSON; one from
another machine or model, or one that does not parse, is refused with one line
(`ProfileError`) and the run goes on without it."""

from __future__ import annotations

import json
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from engines.speculative.costs import StepCosts
from engines.speculative.replay import Rounds

PROFILE_VERSION = 1


class ProfileError(ValueError):
    """A profile that cannot serve this run: one line saying why."""


def machine_id() -> str:
    """What a latency curve depends on: the CPU (or chip), its core count, the OS and the
    machine type. A profile measured elsewhere is not used."""
    import os

    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    if platform.system() == "Darwin":
        import subprocess

        try:
            cpu = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                                 timeout=5).stdout.strip() or cpu
        except (OSError, subprocess.SubprocessError):
            pass
    return f"{platform.system()} {platform.machine()} | {cpu} | {os.cpu_count()} cores"


@dataclass
class Profile:
    machine: str
    model: str  # the target's path (or id) as the run names it
    method: str  # ngram | draft | mtp
    drafter: str  # the draft model / MTP drafter path, "" for n-gram
    target_s: dict[int, float]  # forward width -> seconds of one target forward (one sequence)
    draft_s: float  # seconds to draft one token (n-gram: the lookup)
    acceptance: list[float]  # by draft position 1..: P(accepted | the positions before it were)
    context: int = 0  # tokens in the cache while the latency curve was measured
    batch_s: dict[int, dict[int, float]] = field(default_factory=dict)  # B -> width -> seconds (B sequences)
    # n-gram: every fixed k's rounds replayed on the calibration set's outputs (Rounds.record());
    # a run's prior where it has one ({} in profiles of model drafters and in older profiles)
    replayed: dict = field(default_factory=dict)
    created: float = field(default_factory=time.time)
    version: int = PROFILE_VERSION

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        tmp.replace(path)

    @classmethod
    def read(cls, path: str | Path) -> "Profile":
        """The profile stored at `path`, whatever machine and model it was measured for."""
        data = json.loads(Path(path).read_text())
        data["target_s"] = {int(w): float(s) for w, s in data["target_s"].items()}
        data["batch_s"] = {int(b): {int(w): float(s) for w, s in by_width.items()}
                           for b, by_width in data.get("batch_s", {}).items()}  # absent from older profiles
        return cls(**data)

    @classmethod
    def load(cls, path: str | Path, model: str, method: str, drafter: str = "") -> "Profile":
        """The profile at `path`, if it was measured here for this model and drafter."""
        try:
            profile = cls.read(path)
            if profile.version != PROFILE_VERSION or not profile.target_s or not profile.acceptance:
                raise ValueError("an older or empty profile")
            profile.replayed_rounds()  # parses, or says why not
        except FileNotFoundError:
            raise ProfileError(f"no tuning profile at {path}: run `specscope tune` for this model") from None
        except (OSError, ValueError, TypeError, KeyError) as e:
            raise ProfileError(f"tuning profile {path} is unreadable ({e}); run `specscope tune` again") from None
        if profile.machine != machine_id():
            raise ProfileError(f"tuning profile {path} was measured on another machine ({profile.machine}); "
                               "run `specscope tune` here")
        if (profile.model, profile.method, profile.drafter) != (model, method, drafter or ""):
            raise ProfileError(f"tuning profile {path} is for {profile.model} with {profile.method} "
                               f"{profile.drafter}".rstrip() + "; run `specscope tune` for this one")
        return profile

    def replayed_rounds(self) -> "Rounds | None":
        return Rounds.of(self.replayed) if self.replayed else None

    def latency(self) -> StepCosts:
        costs = StepCosts()
        for width, seconds in self.target_s.items():
            costs.observe(width, seconds)
        return costs

    def batch_costs(self) -> StepCosts:
        """The batch controller's prices: a forward by its B x w tokens, one sequence's curve
        and the batches' (where two shapes have as many tokens, the median of both)."""
        costs = StepCosts()
        for width, seconds in self.target_s.items():
            costs.observe(width, seconds)
        for b, by_width in sorted(self.batch_s.items()):
            for width, seconds in by_width.items():
                costs.observe(b * width, seconds)
        return costs


def profile_file(where: str | Path, model: str, method: str, drafter: str = "") -> Path:
    """The profile for (this machine, model, method, drafter): `where` itself if it is a file,
    else its file in the folder `where`."""
    where = Path(where)
    if where.is_file():
        return where
    import hashlib

    key = hashlib.sha256(f"{machine_id()}|{model}|{method}|{drafter}".encode()).hexdigest()[:12]
    return where / f"{Path(model).name or 'model'}-{method}-{key}.json"


def for_spec(spec, model: str) -> tuple[Profile | None, str | None]:
    """The tuning profile a --steps auto run names (spec.profile: a file, or the folder of
    profiles), measured here for `model` (the target's path) and the spec's drafter; or None
    and the one line saying why not (the run's first Round says it, and the run measures
    itself instead)."""
    if not (spec.enabled and spec.auto and spec.profile):
        return None, None
    drafter = spec.draft_model or ""
    try:
        return Profile.load(profile_file(spec.profile, model, spec.method, drafter), model, spec.method, drafter), None
    except ProfileError as e:
        return None, f"{e} (--steps auto measures this run instead)"
