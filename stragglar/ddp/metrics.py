"""What the hook measures, for the cluster's dashboards and for its log.

Rank 0 of a hook with ``metrics=PATH`` replaces ``PATH`` at each step whose figures arrived with
the figures in the text format of Prometheus's node-exporter textfile collector (point its
``--collector.textfile.directory`` at the folder, and give the file a ``.prom`` suffix): no
client library, and the file is written to a temporary name and renamed, so the collector never
reads half of it.  The same figures make the one log line a change of persistent straggler
gives (:func:`change_line`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence

from stragglar.files import write_text
from stragglar.model.detect import Detection, RankLateness
from stragglar.units import format_seconds

__all__ = ["LOG", "change_line", "prometheus_text", "report"]

LOG = logging.getLogger("stragglar")

_GAUGES = (
    ("stragglar_last_share", "Share of the recent steps at which the rank arrived last."),
    (
        "stragglar_lateness_seconds",
        "The rank's lateness behind the latest other rank, over the recent steps.",
    ),
    ("stragglar_evidence", "The rank's score in the persistent-straggler test, as a share of its threshold."),
    ("stragglar_persistent", "1 where the test names the rank the persistent straggler, else 0."),
)


def report(
    before: int | None,
    detection: Detection,
    figures: Callable[[], Sequence[RankLateness]],
    step: int,
    window: int,
    metrics: str | os.PathLike[str] | None,
    members: Sequence[int] | None = None,
) -> None:
    """Rank 0's report at ``step`` (the step of the latest figures): a line through :data:`LOG`
    where the rule's named rank changed from ``before`` (a warning where one appeared or moved,
    info where it went away), and the ``metrics`` file replaced; ``figures`` (each rank's, over
    the last ``window`` steps) taken only where needed.  ``members``: the global ranks of the
    group probed, by their rank in it (None: the world), which both name the ranks by."""
    if detection.named == before and metrics is None:
        return
    ranks = figures()
    if detection.named != before:
        since = None if detection.since is None else step - (detection.steps - detection.since)
        line = change_line(before, detection.named, since, step, ranks, members)
        LOG.log(logging.INFO if detection.named is None else logging.WARNING, line)
    if metrics is not None:
        write_text(metrics, prometheus_text(step, window, ranks, members))


def prometheus_text(
    step: int, window: int, ranks: Sequence[RankLateness], members: Sequence[int] | None = None
) -> str:
    """The figures of ``ranks`` (over the last ``window`` steps, the latest ``step``) as a
    Prometheus text exposition: one gauge per figure, labelled by rank (and quantile); the rank
    is the global one, where ``members`` maps the group's ranks to them.

    >>> early = RankLateness(0, 0.25, -0.03, -0.01, 0.0, False)
    >>> late = RankLateness(1, 0.75, 0.2, 0.21, 1.0, True)
    >>> text = prometheus_text(12, 4, [early, late])
    >>> [line for line in text.splitlines() if "rank=\\"1\\"" in line][:3]
    ['stragglar_last_share{rank="1"} 0.75', 'stragglar_lateness_seconds{rank="1",quantile="0.5"} 0.2', \
'stragglar_lateness_seconds{rank="1",quantile="0.9"} 0.21']
    >>> "stragglar_persistent_straggler 1" in text, "stragglar_step 12" in text
    (True, True)
    """
    named = next((_global(r.rank, members) for r in ranks if r.persistent), -1)
    lines = [
        "# HELP stragglar_step The training step the latest figures are from.",
        "# TYPE stragglar_step gauge",
        f"stragglar_step {step}",
        "# HELP stragglar_window_steps The recent steps the per-rank figures are taken over.",
        "# TYPE stragglar_window_steps gauge",
        f"stragglar_window_steps {window}",
        "# HELP stragglar_persistent_straggler The rank named the persistent straggler, -1 for none.",
        "# TYPE stragglar_persistent_straggler gauge",
        f"stragglar_persistent_straggler {named}",
    ]
    for name, words in _GAUGES:
        lines += [f"# HELP {name} {words}", f"# TYPE {name} gauge"]
        for r in ranks:
            rank = _global(r.rank, members)
            if name == "stragglar_last_share":
                lines.append(f'{name}{{rank="{rank}"}} {r.last_share!r}')
            elif name == "stragglar_lateness_seconds":
                lines.append(f'{name}{{rank="{rank}",quantile="0.5"}} {r.median!r}')
                lines.append(f'{name}{{rank="{rank}",quantile="0.9"}} {r.p90!r}')
            elif name == "stragglar_evidence":
                lines.append(f'{name}{{rank="{rank}"}} {r.evidence!r}')
            else:
                lines.append(f'{name}{{rank="{rank}"}} {int(r.persistent)}')
    return "\n".join(lines) + "\n"


def change_line(
    before: int | None,
    now: int | None,
    since: int | None,
    step: int,
    ranks: Sequence[RankLateness],
    members: Sequence[int] | None = None,
) -> str:
    """The log line of a change of persistent straggler, from ``before`` to ``now`` (None:
    nobody; ranks in the group probed, named by their global ranks where ``members`` maps them),
    seen at ``step``; ``since``: the step ``now``'s evidence began.

    >>> figures = [RankLateness(0, 0.1, -0.2, -0.01, 0.0, False), RankLateness(1, 0.9, 0.2, 0.21, 1.0, True)]
    >>> change_line(None, 1, 3, 9, figures)  # doctest: +NORMALIZE_WHITESPACE
    'persistent straggler: rank 1 since step 3, last at 90% of the recent steps (chance alone: 50%);
    its lateness over them: median 200 ms, 90th percentile 210 ms'
    >>> change_line(1, None, None, 30, figures)
    'persistent straggler: none from step 30 (rank 1 was)'
    >>> change_line(1, None, None, 30, figures, members=(1, 3))  # HSDP: replica 1 is global rank 3
    'persistent straggler: none from step 30 (rank 3 was)'
    """
    if now is None:
        return f"persistent straggler: none from step {step} (rank {_global(before, members)} was)"
    figures = ranks[now]
    moved = "" if before is None else f" (moved from rank {_global(before, members)})"
    return (
        f"persistent straggler: rank {_global(now, members)} since step {since}{moved}, "
        f"last at {figures.last_share:.0%} "
        f"of the recent steps (chance alone: {100 / len(ranks):.3g}%); its lateness over them: "
        f"median {_signed(figures.median)}, 90th percentile {_signed(figures.p90)}"
    )


def _global(rank: int | None, members: Sequence[int] | None) -> int | None:
    return rank if members is None or rank is None else members[rank]


def _signed(seconds: float) -> str:
    return f"-{format_seconds(-seconds)}" if seconds < 0 else format_seconds(seconds)
