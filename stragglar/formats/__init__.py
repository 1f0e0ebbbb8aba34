"""Schedule file formats; :mod:`stragglar.formats.json` is the native, versioned one."""

from stragglar.formats.json import ScheduleFormatError, read, write

__all__ = ["ScheduleFormatError", "read", "write"]
