"""Schedule file formats: :mod:`~stragglar.formats.schedule_json` is the native, versioned one,
:mod:`~stragglar.formats.text` the readable table; :mod:`~stragglar.formats.traces` reads and
writes the arrival traces that ``stragglar whatif`` replays.

No module here is named like a standard-library one, which is imported beside it.  The JSON
format's module was ``stragglar.formats.json``: that name still imports it, deprecated (each name
taken from it warns).
"""

import sys

from stragglar.formats import schedule_json
from stragglar.formats.schedule_json import ScheduleFormatError, read, write
from stragglar.renamed import RenamedModule

sys.modules[f"{__name__}.json"] = RenamedModule(f"{__name__}.json", schedule_json)  # each name warns

__all__ = ["ScheduleFormatError", "read", "write"]
