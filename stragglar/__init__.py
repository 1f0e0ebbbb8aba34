"""stragglar: synthesize, prove and run StragglAR AllReduce schedules for any number of GPUs."""

from stragglar.schedule import Op, Phase, Schedule, Transfer, move_straggler, relabel_ranks
from stragglar.version import __version__

__all__ = ["Op", "Phase", "Schedule", "Transfer", "__version__", "move_straggler", "relabel_ranks"]
