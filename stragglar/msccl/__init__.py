"""MSCCL XML, the legacy executor's format: lowering, prover and description together.

* :func:`lower` turns a proved schedule into an in-place AllReduce ``<algo>``
  (:mod:`stragglar.msccl.lowering`; options in :class:`XmlOptions`); :func:`write_msccl` writes
  it atomically.
* :func:`read` reads a file's text once with the executor's rules (an :class:`XmlDocument`);
  :func:`prove` proves any MSCCL AllReduce file, its text or document, as the executor runs it
  (:mod:`stragglar.msccl.prover`), sharing no structure with the lowering but the file format's
  own vocabulary (:mod:`stragglar.msccl.vocabulary`); :func:`describe` says what it contains.
* :func:`check_request` refuses, before the schedule is made, a request whose file stragglar
  would not write or the executor not take.

``to_msccl_xml``, ``prove_msccl`` and ``describe_msccl`` are the older names of :func:`lower`
(with keyword options), :func:`prove` and :func:`describe`: deprecated, each call warns.
"""

from stragglar.msccl.errors import MscclExportError, MscclFormatError, MscclVerificationError, MscclViolation
from stragglar.msccl.lowering.lower import (
    DEFAULT_MAX_BYTES,
    DEFAULT_SCRATCH_MAX_BYTES,
    MAX_XML_CELLS,
    MAX_XML_RANKS,
    XmlOptions,
    check_export_size,
    check_request,
    default_name,
    lower,
    lower_with,
    write_msccl,
)
from stragglar.msccl.prover.parsed import XmlDocument, XmlSource
from stragglar.msccl.prover.prove import MscclProof, prove
from stragglar.msccl.prover.prove import check as check_msccl
from stragglar.msccl.prover.read import read
from stragglar.msccl.summary import describe
from stragglar.msccl.vocabulary import PROTOCOLS
from stragglar.renamed import renamed

to_msccl_xml = renamed(
    "stragglar.msccl.to_msccl_xml", "stragglar.msccl.lower(proof, XmlOptions(**options))", lower_with
)
prove_msccl = renamed("stragglar.msccl.prove_msccl", "stragglar.msccl.prove", prove)
describe_msccl = renamed("stragglar.msccl.describe_msccl", "stragglar.msccl.describe", describe)

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_SCRATCH_MAX_BYTES",
    "MAX_XML_CELLS",
    "MAX_XML_RANKS",
    "PROTOCOLS",
    "MscclExportError",
    "MscclFormatError",
    "MscclProof",
    "MscclVerificationError",
    "MscclViolation",
    "XmlDocument",
    "XmlOptions",
    "XmlSource",
    "check_export_size",
    "check_msccl",
    "check_request",
    "default_name",
    "describe",
    "describe_msccl",
    "lower",
    "prove",
    "prove_msccl",
    "read",
    "to_msccl_xml",
    "write_msccl",
]
