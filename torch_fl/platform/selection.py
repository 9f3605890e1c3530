"""Decide which platform is active here: FLAGOS_PLATFORM if set, else the detection rules."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from torch_fl import env
from torch_fl.platform.descriptor import PlatformDescriptor
from torch_fl.platform.detection import Detection, detect
from torch_fl.platform.discovery import load_all
from torch_fl.platform.errors import DescriptorError, SelectionError, clip, did_you_mean


@dataclass(frozen=True)
class Selection:
    """The active platform, why it was chosen, and whether the user forced it by name."""

    name: str
    reason: str
    forced: bool


def select_platform(
    descriptors: Mapping[str, PlatformDescriptor] | None = None,
    detections: list[Detection] | None = None,
    broken: Mapping[str, DescriptorError] | None = None,
) -> Selection:
    """Select the platform for this process.

    `FLAGOS_PLATFORM=name` forces a platform (an unknown name is a SelectionError that lists the
    known ones); otherwise the matching platform with the highest detection priority wins.
    `descriptors` defaults to every discovered platform that loads (and `broken` to the errors of
    those that do not: forcing a broken one raises its error); pass `detections` when the caller
    has already evaluated the rules (to show them) so they are evaluated once.
    """
    if descriptors is None:
        descriptors, broken = load_all()
    broken = broken or {}
    forced = env.get("FLAGOS_PLATFORM")
    if forced:
        if forced in broken:
            raise broken[forced]
        if forced not in descriptors:
            known = ", ".join(sorted(descriptors)) or "none"
            hint = did_you_mean(forced, descriptors)
            raise SelectionError(f"FLAGOS_PLATFORM={clip(forced)}: unknown platform; {hint}known platforms: {known}")
        return Selection(forced, f"forced by FLAGOS_PLATFORM={forced}", True)
    detections = detect(descriptors) if detections is None else detections
    matched = [d for d in detections if d.matched]
    if not matched and broken:
        unreadable = ", ".join(sorted(broken))
        raise SelectionError(
            f"{unreadable} could not be loaded (see the error above), and no other platform's detection "
            "rules match this machine; fix the descriptor or set FLAGOS_PLATFORM"
        )
    if not matched:
        raise SelectionError("no platform's detection rules match this machine; set FLAGOS_PLATFORM")
    best = matched[0]
    reason = f"detected (priority {best.priority}): {best.summary()}"
    tied = [d.name for d in matched[1:] if d.priority == best.priority]
    if tied:
        reason += f"; tied with {', '.join(tied)}, chosen by name"
    # Say which higher-priority platforms could not be ruled out here (e.g. torch not imported).
    skipped: dict[str, list[str]] = {}
    for d in detections:
        if d.priority <= best.priority:
            continue
        for why in dict.fromkeys(r.reason for r in d.results if r.matched is None):
            skipped.setdefault(why, []).append(d.name)
    for why, names in skipped.items():
        reason += f"; rules of {', '.join(names)} {why}"
    return Selection(best.name, reason, False)
