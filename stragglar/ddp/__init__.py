"""A PyTorch DDP communication hook that averages gradient buckets with a StragglAR schedule.

>>> from stragglar.ddp import StragglarState, stragglar_hook          # doctest: +SKIP
>>> ddp.register_comm_hook(StragglarState(policy="auto"), stragglar_hook)  # doctest: +SKIP
>>> ddp.register_comm_hook(StragglarState(straggler=3), stragglar_hook)    # doctest: +SKIP

The hook returns at once with a Future; two worker threads per process group (on CUDA, side
streams) run the rounds and complete it, so communication overlaps the rest of backward as with
DDP's own all_reduce, and the punctual ranks reduce-scatter every ready bucket while the
straggler is away (:mod:`stragglar.ddp.worker`).  Gradients are divided by the world size, then
summed, as DDP's default hook does (summed first, float16 gradients overflow where DDP's do not).

StragglAR only pays when a rank is late by more than a critical delay: with ``policy="auto"`` a
tiny probe per step finds which rank arrives last and by how much (:mod:`stragglar.ddp.probe`),
and each bucket is reduced with StragglAR, that rank as straggler, only when the cost model says
it beats a Ring all_reduce of that size at that lateness; otherwise with the engine's all_reduce
(:mod:`stragglar.model.policy`).  Every rank decides from the same gathered figures, so all choose
the same algorithm for the same bucket.  With ``detect=W`` (policy "stragglar") the hook always
uses StragglAR and switches the straggler to a rank that is persistently last.  Who is
persistently last is decided by one rule with a stated false-alarm rate
(:mod:`stragglar.model.detect`), the same that ``stragglar whatif`` replays; the hook reports it
(:meth:`StragglarState.late_ranks`, a log line on rank 0, and ``metrics=`` for Prometheus).
"""

from stragglar.ddp.hook import POLICIES, StragglarState, stragglar_hook
from stragglar.ddp.probe import LateRankProbe
from stragglar.model.detect import RankLateness, Rule

__all__ = ["POLICIES", "LateRankProbe", "RankLateness", "Rule", "StragglarState", "stragglar_hook"]
