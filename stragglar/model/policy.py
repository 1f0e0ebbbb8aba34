"""When StragglAR pays, and for which straggler: pure functions of the figures every rank gathers.

Every rank calls these with the same gathered figures, so every rank reaches the same choice for
the same bucket; nothing here reads a clock or a rank's own state.

*Lateness.*  At each step the probe (:class:`~stragglar.ddp.probe.LateRankProbe`) gathers each
rank's wait: how long it waited, from posting a tiny all_gather, for the last rank to post it.
Rank ``r``'s lateness at that step is how much later it arrived than the latest of the others,
``min(wait of the others) - wait of r``: positive for the last rank (exactly the model's delay if
it were the straggler), negative for the others.

*Who to bet on.*  The rank the persistent-straggler rule names (:mod:`stragglar.model.detect`: a
sequential test with a stated false-alarm rate), or the straggler the user named; nobody
otherwise, and then the engine's all_reduce.  The saving the bet is expected to bring is judged
on the candidate's record (:func:`choose`): the time its lateness would have hidden over its
recent steps, nothing at those where another rank was last, so a rank last at half the steps
must be about twice as late to be bet on as one last at all of them.

*Critical delay.*  The cost model (:mod:`stragglar.model.cost`) says above which delay StragglAR
beats a Ring AllReduce of the same bucket by :data:`MARGIN` at least; below it the engine's
all_reduce is used.  The margin keeps noise in the fits from switching algorithms back and forth.

*Networks.*  The model prices both algorithms with alpha and bandwidth, fitted
(:func:`~stragglar.model.fits.fit_network`) to the engine's all_reduce times of whole buckets,
each the fastest rank's (the last rank to arrive waits for nobody, so its time is the all_reduce
alone).  StragglAR starts on the same network (the model's assumption: both run on the same
links).  Once it has run, the probe also has its exposed time per bucket (again the fastest
rank's: the straggler's), and :func:`~stragglar.model.fits.cost_ratio` says how many times the
model's price that was: where its rounds cost more than the links explain (a CPU running every
round in Python, ranks sharing cores), StragglAR is priced that many times higher
(:func:`~stragglar.model.fits.scaled`), the critical delay grows or vanishes, and the policy falls
back to the engine's all_reduce.  The ratio is taken against the Ring's network of the same
moment, so a machine that gets slower or faster for both leaves the choice alone.

*Chunks.*  With ``chunks="auto"`` a bucket StragglAR reduces is cut into the chunk count the model
prices fastest for its size on StragglAR's network, summed over the candidate's recent steps
(:func:`chunk_count`; not at its median lateness, a count that may save less over the same
steps): more chunks shorten phase 2's bandwidth term towards one buffer, fewer
save rounds where each round is dear.  Timings carry the chunk count they were measured at, so
the cost ratio prices each against its own schedule.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import TypeVar

from stragglar.args import as_int, as_rank, as_real
from stragglar.errors import ArgumentError, InputError, described
from stragglar.model.chunks import AUTO, resolve_chunks
from stragglar.model.cost import Network, critical_delay, estimate, expect
from stragglar.model.detect import Detection, Rule, check_step_figures, event_rank
from stragglar.model.fits import Timing, cost_ratio, fit_network, scaled_fit
from stragglar.model.predict import generated_profile
from stragglar.synth import check_ranks, check_request

__all__ = [
    "POLICIES",
    "PROBE_LAG",
    "AutoPolicy",
    "Choice",
    "Outlook",
    "choose",
    "chunk_count",
    "critical_delay_for",
    "latenesses",
    "outlook",
]

STRAGGLAR = "stragglar"
ALLREDUCE = "allreduce"
POLICIES = (STRAGGLAR, "auto")  # the DDP hook's: StragglAR for every bucket, or the cost model's choice
MARGIN = 0.05  # the share of a Ring's exposed time StragglAR must be expected to save
PROBE_LAG = 2  # the figures of step s are known at step s + 2 (:class:`~stragglar.ddp.probe.LateRankProbe`)
_Time = TypeVar("_Time", float, Fraction, int)


@dataclass(frozen=True, slots=True)
class Choice:
    """How one bucket is reduced: ``algorithm`` is "stragglar" (with ``straggler``, and ``chunks``
    where not the paper's N-1) or "allreduce"."""

    algorithm: str
    straggler: int | None = None
    chunks: int | None = None


ENGINE = Choice(ALLREDUCE)


@dataclass(frozen=True, slots=True)
class Outlook:
    """One step's figures: the rank bet on as late, how late it is when it is last (the median,
    seconds), how often it was last (``confidence``, in (0, 1]), its lateness at each step judged
    (``seen``: the bet's record), and the networks that price the engine's all_reduce (``ring``)
    and the schedule (``ours``); None where not known yet."""

    candidate: int
    lateness: float
    confidence: float
    seen: tuple[float, ...]
    ring: Network | None
    ours: Network | None

    def __post_init__(self) -> None:
        """Refuse figures no bet can be taken on, in one line: :func:`choose` returned a Choice
        naming rank -1, 1.5 or None as the straggler, bet on a NaN lateness (it compares false
        with the critical delay, so it passed), and failed with ZeroDivisionError on an empty
        record or AttributeError on a network that was not one."""
        object.__setattr__(self, "candidate", as_int(self.candidate, "Outlook.candidate", minimum=0))
        _finite(self.lateness, "Outlook.lateness")
        if not 0 < _finite(self.confidence, "Outlook.confidence") <= 1:
            raise InputError(f"Outlook.confidence must be in (0, 1], got {described(self.confidence)}")
        if isinstance(self.seen, (str, bytes)) or not isinstance(self.seen, Sequence) or not self.seen:
            raise ArgumentError(
                f"Outlook.seen must be a non-empty sequence of latenesses, got {described(self.seen)}"
            )
        object.__setattr__(self, "seen", tuple(self.seen))
        for lateness in self.seen:
            _finite(lateness, "each of Outlook.seen")
        for name, network in (("ring", self.ring), ("ours", self.ours)):
            if network is not None:
                expect(network, Network, f"Outlook.{name}")


def _finite(value: object, name: str) -> float:
    """``value`` as a finite number of seconds (or a share), of any sign."""
    number = as_real(value, name, "seconds")
    if not math.isfinite(number):
        raise InputError(f"{name} must be a finite number, got {described(value)}")
    return number


def latenesses(waits: Sequence[_Time]) -> tuple[_Time, ...]:
    """Each rank's lateness at one step, from every rank's wait (at least two ranks); exact for
    exact waits (a replay of a trace computes them in whole ticks, then rounds each once, as the
    probe's float subtraction does).

    >>> [round(x, 3) for x in latenesses([0.030, 0.001, 0.031, 0.029])]
    [-0.029, 0.028, -0.03, -0.028]
    """
    check_step_figures(waits, "waits")
    order = sorted(range(len(waits)), key=waits.__getitem__)
    first, second = waits[order[0]], waits[order[1]]  # the last rank's wait, the next one's
    return tuple((second if rank == order[0] else first) - wait for rank, wait in enumerate(waits))


def outlook(
    rule: Rule,
    detection: Detection,
    recent: Sequence[Sequence[float]],
    fixed: int | None,
    ring: Network | None,
    ours: Network | None,
    events: Sequence[int | None] | None = None,
) -> Outlook | None:
    """The step's :class:`Outlook` from the rule's state and the latenesses of recent steps
    (``recent``, one row per step, the last row the step the rule saw last); None where there is
    nobody to bet on.  ``events``: each row's :func:`~stragglar.model.detect.event_rank` where the
    caller has them (None: worked out here); a replay judges each step's row at every window
    that holds it, and checks it and finds its last rank once.

    The candidate is ``fixed`` (a straggler the user named), judged over all of ``recent``; else
    the rank the rule names (:mod:`stragglar.model.detect`), judged over the steps since its
    evidence began; else nobody.  Its confidence is the share of those steps at which it had a
    last event, its lateness the median of its lateness at those.

    >>> from stragglar.model.detect import fresh, observe
    >>> rule, rows = Rule(false_alarm=0.01), [(-0.01, 0.03, -0.02)] * 2 + [(-0.01, -0.02, 0.01)]
    >>> state = fresh(3)
    >>> for row in rows[:2]:
    ...     state = observe(rule, state, row)
    >>> outlook(rule, state, rows[:2], None, None, None) is None  # not named yet
    True
    >>> o = outlook(rule, state, rows, 1, None, None)
    >>> o.candidate, o.lateness, round(o.confidence, 3)
    (1, 0.03, 0.667)
    """
    candidate = fixed if fixed is not None else detection.named
    if candidate is None:
        return None
    judged = list(recent)
    marks = None if events is None else list(events)
    if marks is not None and len(marks) != len(judged):
        raise ArgumentError(f"{len(marks)} events for {len(judged)} rows of latenesses: one a row")
    if fixed is None and detection.since is not None:
        judged = judged[-(detection.steps - detection.since + 1) :]
        marks = None if marks is None else marks[len(marks) - len(judged) :]
    if marks is None:
        marks = [event_rank(rule, row) for row in judged]
    when_last = [row[candidate] for row, event in zip(judged, marks, strict=True) if event == candidate]
    if not when_last:
        return None
    seen = tuple(row[candidate] for row in judged)
    return Outlook(candidate, statistics.median(when_last), len(when_last) / len(judged), seen, ring, ours)


@dataclass
class AutoPolicy:
    """The auto policy's memory from step to step: what StragglAR's rounds cost against the model.

    The one stateful part of the decisions, kept beside the pure ones so that every caller (the
    DDP hook each step, a replay of a recorded trace) judges with the same code.  A ``network``
    given prices both algorithms; without one, the Ring's is fitted to the engine's timings each
    step, and StragglAR's is that network scaled by its :func:`~stragglar.model.fits.cost_ratio`,
    taken anew only when a new StragglAR timing has arrived (``priced``: the last one taken).
    ``ring``: the Ring's network at the last judgement, bet or no bet.
    """

    algorithm: str
    network: Network | None = None
    ratio: float = 1.0
    priced: Timing | None = None
    ring: Network | None = None

    def judge(
        self,
        num_ranks: int,
        recent: Sequence[Sequence[float]],
        rule: Rule,
        detection: Detection,
        fixed: int | None,
        samples: Mapping[str, Sequence[Timing]],
        events: Sequence[int | None] | None = None,
    ) -> Outlook | None:
        """The step's :class:`Outlook` (:func:`outlook`) from the latenesses of recent steps
        (``recent``, one row per step, with their ``events`` where the caller has them), the
        rule's state and the gathered ``samples`` of each algorithm; None with nobody to bet on.

        >>> from stragglar.model.fits import RUNS, scaled
        >>> net = Network(0.0, 1e9)  # N = 4: a Ring exposes 6 rounds of a quarter, StragglAR 4 of a third
        >>> ring = [(4 * 10**6, 0, 6e-3)] * RUNS  # exactly the model's price on net
        >>> ours = [(3 * 10**6, 0, 8e-3)] * RUNS  # twice the model's 4 ms
        >>> from stragglar.model.detect import fresh
        >>> policy, step = AutoPolicy("stragglar"), [(-0.01, 0.02, -0.02, -0.03)]
        >>> o = policy.judge(4, step, Rule(), fresh(4), 1, {"allreduce": ring, "stragglar": ours})
        >>> o.candidate, o.ring == net, o.ours == scaled(net, 2.0), policy.ratio
        (1, True, True, 2.0)
        """
        ours = samples[STRAGGLAR]
        ring = self.ring = self.network or fit_network("ring", num_ranks, samples[ALLREDUCE])
        if self.network is None and ring is not None and ours and ours[-1] != self.priced:
            self.priced = ours[-1]
            self.ratio = cost_ratio(self.algorithm, num_ranks, ours, ring) or self.ratio
        # measured, so possibly past what the model prices (a ring fit near its bound, scaled by a
        # ratio below 1): no network then, as with too few timings, never an error mid-training
        mine = None if ring is None else ring if self.network else scaled_fit(ring, self.ratio)
        return outlook(rule, detection, recent, fixed, ring, mine, events)


def chunk_count(
    num_ranks: int,
    size_bytes: int,
    delay: float | Sequence[float],
    network: Network | None,
    chunks: int | str | None,
) -> int | None:
    """The chunks a bucket of ``size_bytes`` is cut into: ``chunks`` itself, or for "auto" the
    cost model's fastest on ``network`` with the straggler ``delay`` seconds late, or summed over
    its lateness at several steps where ``delay`` is a sequence of them
    (:func:`~stragglar.model.chunks.resolve_chunks`); None for the paper's N-1.  A network with
    alpha 0 (:func:`~stragglar.model.fits.fit_network`'s when its sizes cannot separate alpha
    from bandwidth) keeps the paper's N-1: it does not know what a round costs, and would price
    thousands of chunks free.

    >>> fast = Network(3e-6, 450 * 2**30)  # the paper's NVLink: many chunks pay
    >>> chunk_count(8, 2**30, 5e-3, fast, "auto"), chunk_count(8, 2**30, 5e-3, fast, 14)
    (38, 14)
    >>> chunk_count(8, 2**20, 5e-3, Network(1e-3, 1e9), "auto") is None  # dear rounds: the paper's 7
    True
    >>> chunk_count(8, 2**30, 5e-3, Network(0.0, 1e9), "auto") is None  # no alpha known
    True
    """
    if network is not None:
        expect(network, Network, "network")  # True had no attribute 'alpha'
    if chunks == AUTO and network is not None and network.alpha <= 0:
        return None
    num_chunks = resolve_chunks(chunks, num_ranks, size_bytes, delay, network)
    return None if num_chunks == num_ranks - 1 else num_chunks


def critical_delay_for(
    algorithm: str,
    num_ranks: int,
    size_bytes: int,
    ours: Network,
    ring: Network,
    chunks: int | None = None,
) -> float | None:
    """The delay above which ``algorithm``'s schedule (in ``chunks`` chunks, None: its own; priced
    on ``ours``) takes at most ``1 - MARGIN`` of a Ring AllReduce's time (priced on ``ring``) after
    the late rank arrives, for ``size_bytes``; None: at no delay.  Cached: a hook asks for the
    same bucket sizes every step.

    >>> net = Network(1e-4, 1e9)
    >>> round(critical_delay_for("stragglar", 4, 2**24, net, net) * 1e3, 2)  # 16 MiB
    9.68
    >>> critical_delay_for("stragglar", 4, 2**24, Network(1e-4, 0.8e9), net) is None
    True
    """
    expect(ours, Network, "ours")  # checked before the cache, which took a list as "unhashable type"
    expect(ring, Network, "ring")
    request = check_request(algorithm, num_ranks, chunks=chunks)
    size_bytes = as_int(size_bytes, "size_bytes", minimum=1)
    return _critical_delay_for(request.algorithm, request.num_ranks, size_bytes, ours, ring, request.chunks)


@lru_cache(maxsize=4096)
def _critical_delay_for(
    algorithm: str, num_ranks: int, size_bytes: int, ours: Network, ring: Network, chunks: int | None
) -> float | None:
    mine = estimate(generated_profile(algorithm, num_ranks, chunks), size_bytes, 0.0, ours)
    theirs = estimate(generated_profile("ring", num_ranks), size_bytes, 0.0, ring)
    return critical_delay(mine, dataclasses.replace(theirs, tail=theirs.tail * (1 - MARGIN)))


def choose(
    algorithm: str,
    num_ranks: int,
    size_bytes: int,
    step: Outlook | None,
    chunks: int | str | None = None,
) -> Choice:
    """StragglAR with the candidate as straggler, in :func:`chunk_count`'s chunks, when the saving
    it is expected to bring beats a Ring by the margin, judged on the candidate's record; otherwise
    (or with nobody to bet on) the engine's all_reduce.  With ``chunks="auto"`` the count is the
    one the model prices fastest over that same record (``seen``): the bet's saving over the Ring
    is largest there, where the count fastest at the median lateness could save less than the
    paper's N - 1 over the steps.

    At a step where the candidate is last by ``d``, the schedule hides ``min(d, hidden)`` of its
    first phase; where someone else is last, it hides nothing and runs whole after that rank
    arrives, as the Ring does.  So the bet beats the Ring by the margin when the hidden time
    expected over the candidate's recent steps (``seen``), ``mean(min(max(d, 0), hidden))``,
    exceeds the critical delay ``d*`` (:func:`critical_delay_for`: the bet that is sure).  A rank
    last at every step by ``d`` is bet on for ``d > d*``; one last at half the steps needs about
    twice that; a rank last by a hair hides nothing.

    >>> net = Network(2e-4, 1e9)
    >>> late = Outlook(1, 0.030, 1.0, (0.030,) * 4, ring=net, ours=net)
    >>> choose("stragglar", 4, 4 * 2**20, late).straggler, choose("stragglar", 4, 64 * 2**20, late)
    (1, Choice(algorithm='allreduce', straggler=None, chunks=None))
    >>> unsure = Outlook(1, 0.030, 0.25, (0.030, -0.03, -0.01, -0.02), ring=net, ours=net)
    >>> choose("stragglar", 4, 4 * 2**20, unsure)  # last at one step in 4: no bet
    Choice(algorithm='allreduce', straggler=None, chunks=None)
    >>> slow = Network(2e-4, 0.5e9)  # StragglAR's own rounds, measured: half the bandwidth
    >>> choose("stragglar", 4, 4 * 2**20, Outlook(1, 0.030, 1.0, (0.030,), ring=net, ours=slow))
    Choice(algorithm='allreduce', straggler=None, chunks=None)
    >>> nvlink = Network(3e-6, 450 * 2**30)
    >>> sure = Outlook(2, 0.005, 1.0, (0.005,), ring=nvlink, ours=nvlink)
    >>> choose("stragglar", 8, 2**30, sure, chunks="auto")
    Choice(algorithm='stragglar', straggler=2, chunks=38)
    """
    num_ranks = check_ranks(algorithm, num_ranks).num_ranks  # a list was the cache's "unhashable type"
    size_bytes = as_int(size_bytes, "size_bytes", minimum=0)  # 0: an empty bucket, nothing to bet on
    if step is not None:
        expect(step, Outlook, "choose's step")
        as_rank(step.candidate, "the outlook's candidate", num_ranks)  # 5 of 4 GPUs was bet on
    if step is None or step.ring is None or step.ours is None or size_bytes == 0:
        return ENGINE
    if chunks == AUTO:
        num_chunks = _auto_chunks(num_ranks, size_bytes, step.seen, step.ours)
    else:
        num_chunks = chunk_count(num_ranks, size_bytes, step.seen, step.ours, chunks)
    critical = critical_delay_for(algorithm, num_ranks, size_bytes, step.ours, step.ring, num_chunks)
    if critical is None:
        return ENGINE
    hidden = hidden_for(algorithm, num_ranks, size_bytes, step.ours, num_chunks)
    expected = sum(min(max(d, 0.0), hidden) for d in step.seen) / len(step.seen)
    if critical > 0 and expected <= critical:  # 0: the schedule pays even with nothing hidden
        return ENGINE
    return Choice(STRAGGLAR, step.candidate, num_chunks)


@lru_cache(maxsize=1024)
def _auto_chunks(num_ranks: int, size_bytes: int, seen: tuple[float, ...], ours: Network) -> int | None:
    """:func:`chunk_count` under ``chunks="auto"``, cached: pricing every count takes 0.3 ms, and a
    step's buckets, most of one size, meet the same record (a new one each step)."""
    return chunk_count(num_ranks, size_bytes, seen, ours, AUTO)


@lru_cache(maxsize=4096)
def hidden_for(algorithm: str, num_ranks: int, size_bytes: int, ours: Network, chunks: int | None) -> float:
    """The seconds of ``algorithm``'s schedule (in ``chunks`` chunks) that a late straggler can
    hide, for ``size_bytes`` on ``ours``; cached as :func:`critical_delay_for` is.

    >>> round(hidden_for("stragglar", 4, 3 * 10**6, Network(0.0, 1e9), None) * 1e3, 3)  # 2 rounds of 1 MB
    2.0
    """
    return estimate(generated_profile(algorithm, num_ranks, chunks), size_bytes, 0.0, ours).hidden
