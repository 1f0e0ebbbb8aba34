"""The model room: what the alpha-beta cost model predicts, and the decisions taken from it.

Pure functions of schedules and numbers, importable without torch (a test hides torch and
imports every module here), so that the command line, the plots, the measured sweeps, the DDP
hook and an offline replay of a training trace all price and decide with the same code:

* :mod:`~stragglar.model.cost`: the model itself, round by round, for any schedule;
* :mod:`~stragglar.model.predict`: its figures for the schedules this package generates;
* :mod:`~stragglar.model.chunks`: the chunk count it prices fastest, and the one reading of a
  chunk option (a count or ``auto``);
* :mod:`~stragglar.model.detect`: which rank is persistently late, by one sequential test with a
  stated false-alarm rate (the DDP hook's and ``stragglar whatif``'s);
* :mod:`~stragglar.model.policy`: when StragglAR pays, and for which late rank (the DDP hook's
  ``policy="auto"``), from the figures every rank gathers.
"""

from stragglar.model.chunks import (
    AUTO,
    best_chunks,
    best_chunks_over,
    chunk_candidates,
    chunked_loads,
    ranked_chunks,
    resolve_chunks,
)
from stragglar.model.cost import (
    PAPER_NETWORK,
    Comparison,
    Estimate,
    Network,
    Profile,
    compare,
    critical_delay,
    estimate,
    profile,
)
from stragglar.model.predict import compare_generated, generated_profile, schedule_name

__all__ = [
    "AUTO",
    "PAPER_NETWORK",
    "Comparison",
    "Estimate",
    "Network",
    "Profile",
    "best_chunks",
    "best_chunks_over",
    "chunk_candidates",
    "chunked_loads",
    "compare",
    "compare_generated",
    "critical_delay",
    "estimate",
    "generated_profile",
    "profile",
    "ranked_chunks",
    "resolve_chunks",
    "schedule_name",
]
