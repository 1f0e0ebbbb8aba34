"""MSCCL XML, the legacy executor's format: writer, reader and executor model together.

:func:`to_msccl_xml` lowers a proved schedule (stages in :mod:`stragglar.msccl.lower`);
:func:`prove_msccl` proves any MSCCL AllReduce file from its text as the executor runs it
(:mod:`stragglar.msccl.read`, :mod:`stragglar.msccl.machine`, :mod:`stragglar.msccl.order`,
:mod:`stragglar.msccl.executor`), sharing no structure with the lowering but the file format's own
records.
"""

from stragglar.msccl.executor import (
    MscclFormatError,
    MscclProof,
    MscclVerificationError,
    MscclViolation,
    check_msccl,
    prove_msccl,
)
from stragglar.msccl.limits import PROTOCOLS, MscclExportError
from stragglar.msccl.lower import (
    DEFAULT_MAX_BYTES,
    MAX_XML_CELLS,
    MAX_XML_RANKS,
    check_export_size,
    check_request,
    default_name,
    to_msccl_xml,
    write_msccl,
)
from stragglar.msccl.read import describe_msccl

__all__ = [
    "DEFAULT_MAX_BYTES",
    "MAX_XML_CELLS",
    "MAX_XML_RANKS",
    "PROTOCOLS",
    "MscclExportError",
    "MscclFormatError",
    "MscclProof",
    "MscclVerificationError",
    "MscclViolation",
    "check_export_size",
    "check_msccl",
    "check_request",
    "default_name",
    "describe_msccl",
    "prove_msccl",
    "to_msccl_xml",
    "write_msccl",
]
