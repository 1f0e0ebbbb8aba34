"""stragglar: synthesize, prove and run StragglAR AllReduce schedules for any number of GPUs."""

from stragglar.schedule import Op, Phase, Schedule, Transfer, move_straggler, relabel_ranks

__all__ = ["Op", "Phase", "Schedule", "Transfer", "move_straggler", "relabel_ranks"]
__version__ = "0.1.0"
