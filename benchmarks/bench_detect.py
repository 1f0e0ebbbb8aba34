"""The persistent-straggler rule against the window rule it replaced, on simulated arrivals.

    python benchmarks/bench_detect.py [--gpus 4 8 16 32 64] [--trials 400] [--json out.json]
    python benchmarks/bench_detect.py --gpus 4 --trials 20     # a check in seconds, its figures rough

Each step, every rank arrives after a heavy-tailed jitter (Pareto, tail index 1.5, from a hundredth
of the critical delay up), and one rank is late by ``DELAY`` times the critical delay of a 25 MiB
bucket on alpha 10 us, 25 GB/s (the delay above which StragglAR beats a Ring by the policy's
margin).  The scenarios, seeds fixed:

* *random*: a random rank is late at each step: there is no persistent straggler.  10,000 steps
  for the auto policy; 1,000 traces of 100 steps for whatif's verdict.
* *persistent*: 20 random steps, then one rank is the late one at 80% of the steps (a random other
  rank at the rest) for 300 steps; 400 trials for the steps it takes to be named, 40 priced ones
  for the saving kept.
* *moving*: 20 random steps, rank A persistent for 60 steps, then rank B for 60; 400 trials.
* *comes and goes*: 20 random steps, then a straggler on for 40 steps and off (random lateness)
  for 40, three times; 200 trials for the steps to be named and let go, 20 priced ones.
* *chance, the false alarms*: a uniformly random rank last at each step (the worst case the
  threshold is proved for), 200,000 steps at a false-alarm rate of 1% (at the default 0.01% as
  many alarms would take a hundred times the steps): the share of steps at which a false alarm
  begins (a rank named, or the name moved), which the rule promises to keep at most at the rate,
  the share at which some rank is named, and the false names' mean length in steps.

Each rule is asked step by step what the DDP hook and ``stragglar whatif`` ask it: the rule is
run on each step's figures as it comes (found after: steps from the straggler's start, or its move,
to the step the rule names it, 1 = at its first step), and the auto policy decides with the
figures two steps old (the probe's lag), priced by the alpha-beta model.  The old rule: a rank
last in 75% of a window of 4 steps is persistent, and auto bets on the rank with the largest
median lateness over the last 4 steps when that median exceeds the critical delay.  The new rule
is :mod:`stragglar.model.detect` with its defaults and :func:`stragglar.model.policy.choose`.

The oracle knows which rank is persistently late and over which steps, and bets on it over an
episode when that pays over the episode (else it keeps the Ring); "saving kept" is the auto
policy's saving over Ring across all steps as a share of the oracle's (n/a where betting on an
80% straggler never pays: then neither should bet).

The counts above are a full run's (three minutes); ``--trials K`` runs K naming trials instead of
400 and every other count in proportion (:meth:`Counts.scaled`).

*The floor.*  Beside each median the table gives the fewest steps any rule could need, half the
time, while keeping 99% of the random 100-step traces clean (:func:`floor_steps`): where it is
above a target, the target cannot be met together with the clean traces.
"""

from __future__ import annotations

import collections
import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from options import Parser, as_command, json_output, note, whole
from results import save

from stragglar.model import Network
from stragglar.model.detect import (
    FALSE_ALARM,
    MIN_FALSE_ALARM,
    WINDOW,
    Detection,
    Rule,
    fresh,
    last_rank,
    observe,
)
from stragglar.model.policy import (
    PROBE_LAG,
    STRAGGLAR,
    AutoPolicy,
    Choice,
    Outlook,
    choose,
    critical_delay_for,
)
from stragglar.model.policy import latenesses as lateness_of
from stragglar.model.predict import generated_profile
from stragglar.model.whatif import priced
from stragglar.schedule import MAX_RANKS

NETWORK = Network(10e-6, 25e9)
BUCKET = 25 * 2**20
DELAY = 2.0  # the late rank's lateness, in critical delays
SHARE_LATE = 0.8  # a persistent straggler is the late rank at this share of its steps
LEAD = 20  # random steps before a straggler starts
PERSISTENT = 300  # steps of a persistent straggler
OLD_WINDOW, OLD_SHARE = 4, 0.75  # the rule replaced
WORTH = 0.01  # the oracle's least saving, as a share of Ring's time, for "auto keeps" to be shown
GPUS = (4, 8, 16, 32, 64)  # the rank counts N of a full run
CHANCE_FALSE_ALARM = 0.01  # the chance table's rate: in a full run's steps about 2,000 alarms may begin

Truth = list[int | None]  # per step: the persistent straggler, None outside its episodes


@dataclass(frozen=True)
class Counts:
    """How much each scenario simulates; a full run's are the defaults."""

    random_steps: int = 10_000  # steps of random lateness for the auto policy
    # traces of 100 steps of random lateness for whatif's verdict (200 moved it by half a point)
    traces: int = 1000
    # priced trials of a persistent straggler, for the saving kept (half as many that come and go)
    priced_trials: int = 40
    # trials of each straggler for the steps to be named (a median of 40 moves by a step)
    naming_trials: int = 400
    chance_steps: int = 200_000  # steps of pure chance for the false alarms' table

    @classmethod
    def scaled(cls, naming_trials: int) -> Counts:
        """``naming_trials`` naming trials, and every other count in the same proportion to a full
        run's, so that a quick check (``--trials 20``) runs each scenario as a full run does, only
        shorter.  Each keeps at least 2: the priced trials of a straggler that comes and goes are
        half of them, and the Ring's time over those divides."""
        full = cls()

        def share(count: int) -> int:
            return max(2, round(count * naming_trials / full.naming_trials))

        return cls(
            random_steps=share(full.random_steps),
            traces=share(full.traces),
            priced_trials=share(full.priced_trials),
            naming_trials=naming_trials,
            chance_steps=share(full.chance_steps),
        )


@dataclass(frozen=True)
class Naming:
    """Who one rule named at each step of one simulated trace (on that step's figures), and when
    each name's evidence began."""

    named: list[int | None]
    since: list[int | None]  # per step, for the named rank: the step (0-based) its evidence began


@dataclass(frozen=True)
class Run:
    """The auto policy's and the Ring's time over one simulated trace, and what the oracle needs."""

    auto_steps: int
    auto: float
    ring: float
    fixed: dict[int, list[float]]  # per rank: StragglAR with it as straggler, per step (oracle's)
    late: list[tuple[float, ...]]


@dataclass(frozen=True)
class Row:
    n: int
    rule: str
    random_auto_share: float
    random_clean_traces: float
    found_after: float | None
    found_floor: int
    found_share: float
    dated_early: float
    dated_early_by: int
    saving_kept: float | None
    oracle_saving: float  # the oracle's saving over Ring, as a share of Ring's time
    followed_after: float | None
    returns_after: float | None
    let_go_after: float | None
    comes_goes_kept: float | None
    comes_goes_oracle_saving: float


class Arrivals:
    """Simulated arrival times: heavy-tailed jitter on every rank, one rank late."""

    def __init__(self, n: int, seed: int) -> None:
        self.n = n
        self.random = random.Random(seed)
        critical = critical_delay_for(STRAGGLAR, n, BUCKET, NETWORK, NETWORK)
        assert critical is not None and critical > 0
        self.critical = critical
        self.delay = DELAY * critical

    def step(self, late: int | None) -> list[float]:
        jitter = [self.critical / 100 * self.random.paretovariate(1.5) for _ in range(self.n)]
        if late is not None:
            jitter[late] += self.delay
        return jitter

    def random_rank(self, other_than: int | None = None) -> int:
        rank = self.random.randrange(self.n - (other_than is not None))
        return rank + (other_than is not None and rank >= other_than)

    def trace(self, truth: Truth) -> list[list[float]]:
        """One row per step: the persistent straggler is late at SHARE_LATE of its steps, a random
        other rank at the rest; outside its episodes a random rank each step."""
        rows = []
        for who in truth:
            if who is None:
                rows.append(self.step(self.random_rank()))
            else:
                sure = self.random.random() < SHARE_LATE
                rows.append(self.step(who if sure else self.random_rank(other_than=who)))
        return rows


def floor_steps(n: int, share: float = SHARE_LATE, steps: int = 100, clean: float = 0.99) -> int:
    """The fewest steps ``d`` after which a rule could name, with probability 1/2, a rank that
    becomes the late one at ``share`` of the steps, while naming nobody in a ``clean`` share of
    ``steps``-step traces of random lateness.

    Which rank was late is all a step tells here (the late rank's lateness is drawn alike in both
    cases), so over ``d`` steps the most powerful test for one rank counts its late steps
    (Neyman-Pearson, randomised at the boundary count to power exactly 1/2); no rule names that
    rank in ``d`` random steps with a smaller probability.  Where the boundary count is more than
    half of ``d`` two ranks cannot both pass, so the chance that some rank is named is N times it.
    A rule that works from any start must have that power after every clean stretch, so each of the
    ``steps // d`` disjoint runs of ``d`` random steps in a trace adds a fresh chance of a name:
    a trace is clean with probability at most ``(1 - N level) ** (steps // d)``.

    >>> floor_steps(4), floor_steps(8)
    (10, 7)
    """
    chance = 1 / n
    for d in range(1, steps + 1):
        power = level = 0.0
        for count in range(d, -1, -1):
            p_late, p_chance = (
                math.comb(d, count) * p**count * (1 - p) ** (d - count) for p in (share, chance)
            )
            if power + p_late >= 0.5:
                level += (0.5 - power) / p_late * p_chance
                break
            power, level = power + p_late, level + p_chance
        named = n * level if 2 * count > d else level
        if (1 - named) ** (steps // d) >= clean:
            return d
    return steps + 1


def late_rows(rows: Sequence[Sequence[float]]) -> list[tuple[float, ...]]:
    return [lateness_of([max(row) - t for t in row]) for row in rows]


Named = tuple[list[int | None], list[int | None], list[Detection]]  # per step: name, its "since", state


def new_names(late: Sequence[Sequence[float]], n: int, rule: Rule) -> Named:
    """The rule, run on each step's figures as they come, as the hook and whatif run it."""
    state = fresh(n)
    named: list[int | None] = []
    since: list[int | None] = []
    states = []
    for row in late:
        state = observe(rule, state, row)
        states.append(state)
        named.append(state.named)
        since.append(None if state.since is None else state.since - 1)
    return named, since, states


def new_outlooks(
    late: Sequence[Sequence[float]], n: int, rule: Rule, states: list[Detection]
) -> list[Outlook | None]:
    """The auto policy's outlook at each step, on the rule's state two steps old (the probe's lag)."""
    policy = AutoPolicy(STRAGGLAR, NETWORK)
    none: dict[str, list[tuple[int, int, float]]] = {"allreduce": [], "stragglar": []}
    outlooks: list[Outlook | None] = []
    for i in range(len(late)):
        arrived = i - PROBE_LAG + 1
        outlooks.append(
            None
            if arrived <= 0
            else policy.judge(
                n, late[max(0, arrived - WINDOW) : arrived], rule, states[arrived - 1], None, none
            )
        )
    return outlooks


def old_names(late: Sequence[Sequence[float]], n: int, rule: Rule) -> Named:
    """The window rule it replaced: finds with a new window after each."""
    named: list[int | None] = []
    since: list[int | None] = []
    window: collections.deque[int | None] = collections.deque(maxlen=OLD_WINDOW)
    current: int | None = None
    for i, row in enumerate(late):
        window.append(last_rank(row))
        counts = collections.Counter(r for r in window if r is not None)
        if len(window) == OLD_WINDOW and counts:
            rank, times = counts.most_common(1)[0]
            if times >= OLD_SHARE * OLD_WINDOW and rank != current:
                current = rank
                window.clear()
        named.append(current)
        since.append(None if current is None else i)
    return named, since, []


def old_outlooks(
    late: Sequence[Sequence[float]], n: int, rule: Rule, states: list[Detection]
) -> list[Outlook | None]:
    """The old auto policy: a bet on the rank with the largest median lateness over the last 4 steps."""
    outlooks: list[Outlook | None] = []
    for i in range(len(late)):
        arrived = i - PROBE_LAG + 1
        recent = late[max(0, arrived - OLD_WINDOW) : arrived] if arrived > 0 else []
        if len(recent) < OLD_WINDOW:
            outlooks.append(None)
            continue
        medians = [statistics.median(column) for column in zip(*recent, strict=True)]
        rank = max(range(n), key=medians.__getitem__)
        outlooks.append(Outlook(rank, medians[rank], 1.0, (medians[rank],), NETWORK, NETWORK))
    return outlooks


OLD = "window of 4 (old)"
NEW = "sequential test (new)"
Namer = Callable[[Sequence[Sequence[float]], int, Rule], Named]
Bettor = Callable[[Sequence[Sequence[float]], int, Rule, list[Detection]], list[Outlook | None]]
RULES: dict[str, tuple[Namer, Bettor]] = {OLD: (old_names, old_outlooks), NEW: (new_names, new_outlooks)}


def names(rule: str, rows: list[list[float]], n: int, params: Rule) -> Naming:
    """Who ``rule`` names at each step of ``rows``, no bet priced."""
    named, since, _ = RULES[rule][0](late_rows(rows), n, params)
    return Naming(named, since)


def run(rule: str, rows: list[list[float]], n: int, oracle: bool, params: Rule) -> Run:
    late = late_rows(rows)
    namer, bettor = RULES[rule]
    _, _, states = namer(late, n, params)
    outlooks = bettor(late, n, params, states)
    ring_prof, paper = generated_profile("ring", n), generated_profile(STRAGGLAR, n)
    auto = ring = 0.0
    auto_steps = 0
    fixed: dict[int, list[float]] = {r: [] for r in range(n)} if oracle else {}
    for row, outlook in zip(rows, outlooks, strict=True):
        first = min(row)
        seconds = [t - first for t in row]
        latest = max(range(n), key=seconds.__getitem__)
        ring_time = priced(ring_prof, seconds, latest, BUCKET, NETWORK)
        choice: Choice = choose(STRAGGLAR, n, BUCKET, outlook)
        ring += ring_time
        if choice.straggler is None:
            auto += ring_time
        else:
            auto_steps += 1
            auto += priced(paper, seconds, choice.straggler, BUCKET, NETWORK)
        for r in fixed:
            fixed[r].append(ring_time - priced(paper, seconds, r, BUCKET, NETWORK))
    return Run(auto_steps, auto, ring, fixed, late)


def episodes(truth: Truth) -> list[tuple[int, int, int]]:
    """(rank, first step, end step) of each stretch with a persistent straggler."""
    found, start = [], 0
    for i in range(1, len(truth) + 1):
        if i == len(truth) or truth[i] != truth[start]:
            rank = truth[start]
            if rank is not None:
                found.append((rank, start, i))
            start = i
    return found


def oracle_saving(result: Run, truth: Truth, late: Sequence[Sequence[float]], n: int) -> float:
    """What betting on the persistent straggler over each of its episodes saves where the policy's
    own test (:func:`~stragglar.model.policy.choose`) says the bet pays on the episode's record."""
    saved = 0.0
    for rank, a, b in episodes(truth):
        seen = tuple(row[rank] for row in late[a:b])
        when_last = [d for d in seen if d > 0] or [0.0]
        view = Outlook(rank, statistics.median(when_last), len(when_last) / len(seen), seen, NETWORK, NETWORK)
        if choose(STRAGGLAR, n, BUCKET, view).straggler is not None:
            saved += sum(result.fixed[rank][a:b])
    return saved


def found_after(result: Naming, rank: int, start: int, end: int) -> int | None:
    """Steps from ``start`` until the rule names ``rank`` (1: at once); None: not before ``end``."""
    return next((i - start + 1 for i in range(start, end) if result.named[i] == rank), None)


def let_go_after(result: Naming, rank: int, end: int, stop: int) -> int | None:
    return next((i - end + 1 for i in range(end, stop) if result.named[i] != rank), None)


def median_or_none(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def kept(auto: float, oracle: float, ring: float) -> float | None:
    """The auto policy's saving as a share of the oracle's; None where the oracle saves under
    :data:`WORTH` of Ring's time (a share of almost nothing says nothing)."""
    return auto / oracle if oracle >= WORTH * ring else None


def bench(n: int, rule: str, params: Rule, counts: Counts) -> Row:
    seed = 1000 * n
    sim = Arrivals(n, seed)
    long = run(rule, sim.trace([None] * counts.random_steps), n, oracle=False, params=params)
    traces = [names(rule, sim.trace([None] * 100), n, params) for _ in range(counts.traces)]
    clean = sum(all(x is None for x in t.named) for t in traces)
    sim = Arrivals(n, seed + 1)
    delays, early, early_by = [], 0, 0
    for _ in range(counts.naming_trials):
        who = sim.random_rank()
        truth: Truth = [None] * LEAD + [who] * PERSISTENT
        result = names(rule, sim.trace(truth), n, params)
        after = found_after(result, who, LEAD, len(truth))
        delays.append(after if after is not None else PERSISTENT + 1)
        if after is not None:
            since = result.since[LEAD + after - 1]
            early_by = max(early_by, 0 if since is None else LEAD - since)
            early += since is not None and since < LEAD
    found = [d for d in delays if d <= PERSISTENT]
    auto_saved, oracle_saved, ring = 0.0, 0.0, 0.0
    for _ in range(counts.priced_trials):
        who = sim.random_rank()
        truth = [None] * LEAD + [who] * PERSISTENT
        times = run(rule, sim.trace(truth), n, oracle=True, params=params)
        ring += times.ring
        auto_saved += times.ring - times.auto
        oracle_saved += oracle_saving(times, truth, times.late, n)
    sim = Arrivals(n, seed + 2)
    followed = []
    for _ in range(counts.naming_trials):
        a = sim.random_rank()
        b = sim.random_rank(other_than=a)
        truth = [None] * LEAD + [a] * 60 + [b] * 60
        result = names(rule, sim.trace(truth), n, params)
        after = found_after(result, b, LEAD + 60, len(truth))
        followed.append(after if after is not None else 61)
    sim = Arrivals(n, seed + 3)
    returns, gone, cg_auto, cg_oracle, cg_ring = [], [], 0.0, 0.0, 0.0
    comes_goes = [None] * LEAD + ([0] * 40 + [None] * 40) * 2 + [0] * 40
    for _ in range(counts.naming_trials // 2):
        who = sim.random_rank()
        truth = [None if w is None else who for w in comes_goes]
        result = names(rule, sim.trace(truth), n, params)
        for rank, a, b in episodes(truth):
            after = found_after(result, rank, a, b)
            returns.append(after if after is not None else 41)
            if b < len(truth):
                away = let_go_after(result, rank, b, b + 40)
                gone.append(away if away is not None else 41)
    for _ in range(counts.priced_trials // 2):
        who = sim.random_rank()
        truth = [None if w is None else who for w in comes_goes]
        times = run(rule, sim.trace(truth), n, oracle=True, params=params)
        cg_ring += times.ring
        cg_auto += times.ring - times.auto
        cg_oracle += oracle_saving(times, truth, times.late, n)
    return Row(
        n,
        rule,
        long.auto_steps / counts.random_steps,
        clean / counts.traces,
        median_or_none(delays),
        floor_steps(n),
        len(found) / counts.naming_trials,
        early / max(1, len(found)),
        early_by,
        kept(auto_saved, oracle_saved, ring),
        oracle_saved / ring,
        median_or_none(followed),
        median_or_none(returns),
        median_or_none(gone),
        kept(cg_auto, cg_oracle, cg_ring),
        cg_oracle / cg_ring,
    )


@dataclass(frozen=True)
class Chance:
    """The rule's false alarms under pure chance at one N: the share of steps at which one began,
    the share at which some rank was named, and the false names' mean length in steps."""

    n: int
    false_alarm: float
    begun: float
    named: float
    mean_length: float | None


def chance(n: int, steps: int, false_alarm: float = CHANCE_FALSE_ALARM) -> Chance:
    """:class:`Chance` over ``steps`` steps, each with a uniformly random rank last (seeded)."""
    draw, rule, state = random.Random(7 * n), Rule(false_alarm=false_alarm), fresh(n)
    begun = named = 0
    rows = [tuple(1.0 if r == last else 0.0 for r in range(n)) for last in range(n)]
    for _ in range(steps):
        before = state.named
        state = observe(rule, state, rows[draw.randrange(n)])
        begun += state.named is not None and state.named != before
        named += state.named is not None
    return Chance(n, false_alarm, begun / steps, named / steps, named / begun if begun else None)


def chance_table(rows: list[Chance]) -> str:
    header = ("N", "false-alarm rate", "false alarms begun (share of steps)", "steps named", "mean length")
    lines = ["| " + " | ".join(header) + " |", "|---:" * len(header) + "|"]
    for r in rows:
        length = "-" if r.mean_length is None else f"{r.mean_length:.1f}"
        cells = (str(r.n), f"{r.false_alarm:g}", f"{r.begun:.3%}", f"{r.named:.2%}", length)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _share(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def _kept(x: float | None, oracle: float) -> str:
    return f"n/a (the oracle saves {oracle:.1%})" if x is None else f"{x:.1%}"


def _steps(x: float | None) -> str:
    return "-" if x is None else f"{x:g}"


HEADER = (
    "N",
    "rule",
    "random: auto bets",
    "random: clean 100-step traces",
    "persistent: found after (median steps)",
    "found",
    "dated before its start (most steps)",
    "auto keeps of the oracle's saving",
    "moving: followed after",
    "comes and goes: found after / let go after",
    "auto keeps",
)


def table(rows: list[Row]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|---:|---|" + "---:|" * (len(HEADER) - 2)]
    for r in rows:
        cells = (
            str(r.n),
            r.rule,
            _share(r.random_auto_share),
            _share(r.random_clean_traces),
            f"{_steps(r.found_after)} (floor {r.found_floor})",
            _share(r.found_share),
            f"{_share(r.dated_early)} ({r.dated_early_by})",
            _kept(r.saving_kept, r.oracle_saving),
            f"{_steps(r.followed_after)} (floor {r.found_floor})",
            f"{_steps(r.returns_after)} / {_steps(r.let_go_after)}",
            _kept(r.comes_goes_kept, r.comes_goes_oracle_saving),
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = Parser(description=__doc__.split("\n\n")[0])
    # from 4: at 3 StragglAR never pays for the bucket on this network (no critical delay to scale)
    parser.add_gpus(default=list(GPUS), says="rank counts, 4 or more", parse=whole(4, MAX_RANKS))
    parser.add_argument(
        "--false-alarm",
        type=float,
        default=FALSE_ALARM,
        help="the new rule's false-alarm rate (the most probability a false alarm begins at a step)",
    )
    parser.add_argument(
        "--trials",
        type=whole(2, 10**5),
        default=Counts.naming_trials,
        metavar="K",
        help="trials of each straggler for the steps to be named; the other scenarios' trials, "
        "traces and steps in proportion (20: a check in seconds, its figures rough)",
    )
    parser.add_argument(
        "--json", type=json_output, metavar="FILE", help="write the rows and the machine to this file"
    )
    args = parser.parse_args(argv)
    if not MIN_FALSE_ALARM <= args.false_alarm < 1:
        parser.error(f"--false-alarm must be in [{MIN_FALSE_ALARM:g}, 1)")
    params = Rule(false_alarm=args.false_alarm)
    counts = Counts.scaled(args.trials)
    start, rows = time.perf_counter(), []
    for n in args.gpus:
        for rule in RULES:
            rows.append(bench(n, rule, params, counts))
            note(f"N = {n}, {rule}: done")
    chances = []
    for n in args.gpus:
        chances.append(chance(n, counts.chance_steps))
        note(f"N = {n}, chance: done")
    print(table(rows))
    print(
        f"\nthe new rule's false-alarm rate (the most probability a false alarm begins at a step): "
        f"{params.false_alarm:g}\n"
    )
    print(chance_table(chances))
    shown = ", ".join(f"{count:,} {name.replace('_', ' ')}" for name, count in asdict(counts).items())
    print(f"\n{shown}; {time.perf_counter() - start:.0f} s")
    if args.json:
        document = {
            "false_alarm": params.false_alarm,
            "counts": asdict(counts),
            "rows": [asdict(r) for r in rows],
        }
        save(args.json, {**document, "chance": [asdict(c) for c in chances]})


if __name__ == "__main__":
    as_command(main)
