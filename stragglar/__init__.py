"""stragglar: synthesize, prove and run StragglAR AllReduce schedules for any number of GPUs.

The schedule IR's names load when first asked for (``stragglar.Schedule``), so that the
``stragglar`` command's entry point (:mod:`stragglar.__main__`) runs before NumPy loads.
"""

from typing import TYPE_CHECKING, Any

from stragglar.version import __version__

if TYPE_CHECKING:
    from stragglar.schedule import Op, Phase, Schedule, Transfer, move_straggler, relabel_ranks

__all__ = ["Op", "Phase", "Schedule", "Transfer", "__version__", "move_straggler", "relabel_ranks"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from stragglar import schedule

        return getattr(schedule, name)
    raise AttributeError(f"module 'stragglar' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
