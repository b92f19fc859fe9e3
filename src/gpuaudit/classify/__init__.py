"""Classify: where GPU time went (phases), its shape (patterns), why (diagnosis), health."""

from gpuaudit.classify.diagnose import Diagnosis, diagnose
from gpuaudit.classify.health import HealthIssue, check_health
from gpuaudit.classify.passes import classify
from gpuaudit.classify.phases import group_key_names
from gpuaudit.classify.usage import PHASES, Pattern, PhaseTime, SeriesSignals, Usage

__all__ = [
    "PHASES",
    "Diagnosis",
    "HealthIssue",
    "Pattern",
    "PhaseTime",
    "SeriesSignals",
    "Usage",
    "check_health",
    "classify",
    "diagnose",
    "group_key_names",
]
