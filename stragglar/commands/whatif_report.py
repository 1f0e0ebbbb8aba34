"""The report of ``stragglar whatif``: the lines it prints for each replayed group, and its JSON
document.

Kept apart from the command (:mod:`stragglar.commands.whatif`), which reads the trace, checks what
it holds and replays it: what is said of a replay, in words and in figures, is read and changed
on its own, and the command's module keeps to its options and the checks of its inputs.
"""

from __future__ import annotations

from typing import Any

from stragglar.errors import quoted
from stragglar.formats.traces import Group
from stragglar.model.detect import Rule, event_rank
from stragglar.model.policy import Choice
from stragglar.model.whatif import AUTO_POLICY, CHUNKED, PRICED, Episode, GroupReplay, Setting
from stragglar.units import format_seconds

__all__ = ["document", "group_lines", "rule_words", "step_count"]


def _rank(group: Group, rank: int) -> str:
    """``rank 2``, with the trace's own label where it is another: ``rank 2 ('gpu7')``."""
    label = group.ranks[rank]
    return f"rank {rank}" if label == str(rank) else f"rank {rank} ({quoted(label)})"


def _signed(seconds: float) -> str:
    return f"-{format_seconds(-seconds)}" if seconds < 0 else format_seconds(seconds)


def _saving(saved: float, ring: float) -> str:
    """``saves 4.6 ms (2.0%)``, or ``costs 3.1 ms more (3.2%)``."""
    if saved >= 0:
        return f"saves {format_seconds(saved)} ({saved / ring:.1%})"
    return f"costs {format_seconds(-saved)} more ({-saved / ring:.1%})"


def rule_words(rule: Rule) -> str:
    """``a persistent straggler is last more often than chance (1/N) ...``: the rule, in words."""
    margin = f" by more than {format_seconds(rule.margin)}" if rule.margin else ""
    return (
        f"a persistent straggler is last{margin} more often than chance (1/N), by a sequential "
        f"test whose false alarms begin at {_percent(rule.false_alarm)} of steps at most where steps "
        f"are independent, tuned to a rank last at {rule.share:.0%}"
    )


def _percent(share: float) -> str:
    """``12.5%``, ``0.01%``: a share with the digits it needs."""
    return f"{share * 100:.3g}%"


def group_lines(group: Group, result: GroupReplay, rule: Rule, per_step: bool) -> list[str]:
    """A replayed group's lines of the report: its headline, the ranks named persistently late
    before, what each priced algorithm takes beside Ring, and with ``per_step`` a line per step."""
    steps = len(result.steps)
    title = "the trace" if group.name is None else f"group {quoted(group.name)}"
    left_out = (
        f" ({group.partial:,} more that only some ranks recorded are left out)" if group.partial else ""
    )
    lines = [f"{title}: {result.num_ranks} ranks, {step_count(steps)}{left_out}"]
    if not group.allreduce:  # a ReduceScatter's arrivals tell who is late as well; its price is a guess
        lines.append(f"  its collectives are {group.kind}: priced here as AllReduces of the same bytes")
    lines.append(f"  {_verdict(group, result, rule)}")
    earlier = [e for e in result.episodes if e.until is not None]
    if earlier:
        named = ", ".join(_episode(group, e) for e in earlier)
        lines.append(f"  named persistently late before: {named}")
    straggler = _rank(group, result.straggler)
    if result.episodes:
        median, p90 = result.lateness(0.5), result.lateness(0.9)
        assert median is not None and p90 is not None  # a named rank was last at some step
        lines.append(
            f"  {straggler} at the steps it was last: later than the next-latest rank by "
            f"{format_seconds(median)} (median), {format_seconds(p90)} (90th percentile)"
        )
    ring = result.total("ring")
    lines.append("  predicted from the first arrival, per step and in all, and the saving over ring:")
    names = {algorithm: _algorithm_name(algorithm, group, result) for algorithm in PRICED}
    width = max(map(len, names.values()))
    totals = {algorithm: result.total(algorithm) for algorithm in PRICED}
    per_step_text = {a: format_seconds(total / steps) for a, total in totals.items()}
    total_text = {a: format_seconds(total) for a, total in totals.items()}
    step_width = max(10, *map(len, per_step_text.values()))  # wider where a trace's times are huge
    total_width = max(10, *map(len, total_text.values()))
    for algorithm in PRICED:
        saving = "" if algorithm == "ring" else f"   {_saving(ring - totals[algorithm], ring)}"
        lines.append(
            f"    {names[algorithm]:<{width}} {per_step_text[algorithm]:>{step_width}} "
            f"{total_text[algorithm]:>{total_width}}{saving}"
        )
    lines.append(f"  the auto policy chose StragglAR at {result.stragglar_steps:,} of {steps:,} steps")
    if per_step:
        columns = "  ".join(f"{a:>16}" for a in PRICED)
        lines.append(f"    step  rank last  late by    {columns}  auto chose")
        for s in result.steps:
            chose = ", ".join(_choice(c) for c in dict.fromkeys(s.choices))
            figures = "  ".join(f"{format_seconds(s.predicted[a]):>16}" for a in PRICED)
            who = "-" if s.last is None else str(s.last)
            lines.append(f"    {s.step:>4}  {who:>9}  {_signed(max(s.late)):>7}    {figures}  {chose}")
    return lines


def _verdict(group: Group, result: GroupReplay, rule: Rule) -> str:
    """The headline: the persistent straggler at the trace's end, or that there is none, with the
    share of steps it (or the rank last most often) was last beside what chance gives."""
    steps = len(result.steps)
    # the steps the rule counts (its events: last by more than the margin), not last alone
    counted = sum(event_rank(rule, s.late) == result.straggler for s in result.steps)
    by = f" by more than {format_seconds(rule.margin)}" if rule.margin > 0 else ""
    last = f"was last{by} at {counted:,} of {steps:,} steps ({counted / steps:.0%})"
    chance = f"chance alone: {_percent(result.chance)}"
    now = result.persistent_straggler
    if now is None:
        if not rule.finds(result.num_ranks):
            return (
                f"no persistent straggler can be named: --share {_percent(rule.share)} is no more "
                f"than chance ({_percent(result.chance)}) among {result.num_ranks} ranks"
            )
        if result.times_last == 0:
            return "no persistent straggler: no rank was ever last alone"
        when = " at the trace's end" if result.episodes else ""  # the ranks named before follow
        fewest = rule.fewest_steps(result.num_ranks)
        short = (
            f"; {steps:,} {'step is' if steps == 1 else 'steps are'} too few: the rule names a rank "
            f"after {fewest} at the least"
            if fewest is not None and steps < fewest
            else ""
        )
        return f"no persistent straggler{when}: {_rank(group, result.straggler)} {last}; {chance}{short}"
    episode = result.episodes[-1]
    return (
        f"persistent straggler: {_rank(group, now)}, from step {episode.since} (named at step "
        f"{episode.named}); it {last}; {chance}"
    )


def _episode(group: Group, episode: Episode) -> str:
    """``rank 3 from step 4 (named at step 9, let go at step 27)``: the rule lets go of a rank
    some steps after it stopped being late (once its evidence is spent), so the step it let go
    at is said as such, not as the end of the lateness."""
    return (
        f"{_rank(group, episode.rank)} from step {episode.since} (named at step {episode.named}, "
        f"let go at step {episode.until})"
    )


def _choice(choice: Choice) -> str:
    """``allreduce``, ``stragglar, rank 2 late`` or ``stragglar, rank 2 late, 38 chunks``."""
    if choice.straggler is None:
        return choice.algorithm
    return f"stragglar, rank {choice.straggler} late" + (f", {choice.chunks} chunks" if choice.chunks else "")


def step_count(count: int) -> str:
    """``1 step``, ``12,345 steps``: a trace's steps, in thousands where many."""
    return f"{count:,} {'step' if count == 1 else 'steps'}"


def _algorithm_name(algorithm: str, group: Group, result: GroupReplay) -> str:
    """What each priced figure is, in words: the straggler it takes and why."""
    role = "persistent straggler" if result.episodes else "last most often"
    late = f"{_rank(group, result.straggler)} ({role}) late"
    if algorithm == "stragglar":
        return f"stragglar, {late}"
    if algorithm == CHUNKED:
        counts = ", ".join(str(c) if c else f"{result.num_ranks - 1}" for c in result.chunks)
        return f"stragglar in {counts} {'chunk' if counts == '1' else 'chunks'}, {late}"
    if algorithm == AUTO_POLICY:
        return "auto policy"
    return algorithm


def document(
    trace: str, fmt: str, unit: str, setting: Setting, groups: list[Group], replays: list[GroupReplay]
) -> dict[str, Any]:
    """The ``--json`` document: the trace, the setting it was replayed with, and every group's
    figures, per step too."""
    return {
        "trace": trace,
        "format": fmt,
        "time_unit": unit,
        "network": {"alpha": setting.network.alpha, "bandwidth": setting.network.bandwidth},
        "buckets": list(setting.buckets),
        "window": setting.window,
        "rule": {
            "false_alarm": setting.rule.false_alarm,
            "share": setting.rule.share,
            "margin": setting.rule.margin,
        },
        "chunks": setting.chunks,
        "groups": [_group_document(g, r) for g, r in zip(groups, replays, strict=True)],
    }


def _group_document(group: Group, result: GroupReplay) -> dict[str, Any]:
    ring = result.total("ring")
    return {
        "group": group.name,
        "ranks": list(group.ranks),
        "steps": len(result.steps),
        "steps_left_out": group.partial,  # recorded by some ranks only (a buffer wrapped, a sample)
        "collective": group.kind,  # as the trace names it; None where it does not
        "persistent_straggler": result.persistent_straggler,
        "persistent_stragglers": [
            {"rank": e.rank, "since": e.since, "named": e.named, "until": e.until} for e in result.episodes
        ],
        "straggler": result.straggler,
        "last_share": result.last_share,
        "chance": result.chance,
        "lateness_when_last_median": result.lateness(0.5),
        "lateness_when_last_p90": result.lateness(0.9),
        "chunks": [c or result.num_ranks - 1 for c in result.chunks],
        "totals": {a: result.total(a) for a in PRICED},
        "savings": {a: ring - result.total(a) for a in PRICED if a != "ring"},
        "auto_stragglar_steps": result.stragglar_steps,
        "decisions": [list(d) for d in result.decisions],
        "per_step": [
            {
                "step": s.step,
                "lateness": list(s.late),
                "last": s.last,
                "auto": [
                    {"algorithm": c.algorithm, "straggler": c.straggler, "chunks": c.chunks}
                    for c in s.choices
                ],
                "predicted": s.predicted,
            }
            for s in result.steps
        ],
    }
