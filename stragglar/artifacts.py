"""The executors' file formats in one registry: what the rest of stragglar knows of each.

A proved schedule is exported for two executors, MSCCL (an XML ``<algo>``) and MSCCL++ (a JSON
execution plan), and a file of either is proved again from its own text.  Each format is one
:class:`ArtifactFormat`: its names, its file suffixes, the export options that shape it, how it
lowers a proof to text, and how a file of it is recognised, read, proved, described and, where
the executor picks a file by buffer size, sized.  Both packages offer those tools under the same
verbs (``lower``, ``read``, ``prove``, ``describe``, ``check_request``), so each format here is
little more than its words and how :class:`ExportOptions` become its own options.  The command
line, the release and the proof tier go through :data:`FORMATS` and never test a format's name, so
the two packages (:mod:`stragglar.msccl`, :mod:`stragglar.mscclpp`, which never import each other)
meet only here.

One set of export options serves both (:class:`ExportOptions`, the command line's ``--name``,
``--proto``, ...); a format takes those in its ``options`` and adapts them to its own lowering
(:class:`~stragglar.msccl.XmlOptions`, :class:`~stragglar.mscclpp.PlanOptions`), and refuses the
others rather than ignore them.

A request is checked once, before the schedule is made: :attr:`ArtifactFormat.check_request`,
with the request :func:`stragglar.synth.check_request` returned, refuses in microseconds what N,
the chunk count, the algorithm and the options tell (:meth:`ArtifactFormat.max_chunks` bounds the
chunk count a caller may pick).  The lowering keeps the same limits as a guard for callers of
the packages that did not ask first; it costs as little.

>>> from stragglar.synth import synthesize
>>> from stragglar.verify import prove
>>> [(f.name, f.title, f.suffixes) for f in FORMATS.values()]
[('msccl', 'MSCCL XML', ('.xml',)), ('mscclpp', 'MSCCL++ plan', ('.json',))]
>>> text = MSCCLPP.lower(prove(synthesize("stragglar", 4)), ExportOptions(instances=2))
>>> MSCCLPP.prove(text).brief
'8 thread blocks, 280 ops'
>>> MSCCL.lower(prove(synthesize("stragglar", 4)), ExportOptions(max_threadblocks=64))
Traceback (most recent call last):
...
stragglar.errors.InputError: max_threadblocks does not shape MSCCL XML: it shapes MSCCL++ plans only
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from stragglar import msccl, mscclpp
from stragglar.args import as_int
from stragglar.errors import ArgumentError, InputError, described
from stragglar.msccl import XmlDocument, XmlOptions
from stragglar.mscclpp import DEFAULT_MAX_THREADBLOCKS, PlanDocument, PlanOptions, SizeRule
from stragglar.schedule import Schedule
from stragglar.synth import Request
from stragglar.verify import Proof
from stragglar.verify.report import ArtifactProof

__all__ = ["FORMATS", "MSCCL", "MSCCLPP", "PROTOCOLS", "ArtifactFormat", "ExportOptions", "format_of"]

PROTOCOLS = msccl.PROTOCOLS  # what ExportOptions.proto may be
D = TypeVar("D")  # a file of the format as its tools read it: the text, or a parsed document


@dataclass(frozen=True, kw_only=True)
class ExportOptions:
    """How to export a proved schedule, in terms common to the formats (``synth``'s and ``export``'s
    options).  ``None`` leaves the choice to the format: the name from the schedule, and the
    message sizes the executor uses the file for (MSCCL XML: 0 to 1 TiB, or 1 GiB for a file with
    scratch; MSCCL++: every usable size whose chunk offsets fit 32 bits).  ``proto`` shapes MSCCL
    XML only, ``max_threadblocks`` (thread blocks one GPU runs at once) MSCCL++ plans only."""

    name: str | None = None
    proto: str = "Simple"
    instances: int = 1
    min_bytes: int | None = None
    max_bytes: int | None = None
    max_threadblocks: int = DEFAULT_MAX_THREADBLOCKS


@dataclass(frozen=True)
class ArtifactFormat(Generic[D]):
    """One executor's file format: its words, files and options, and its tools.

    ``read`` turns a file's text into what the tools take (a parsed document, so that one file is
    parsed once however many tools look at it); ``prove``, ``describe`` and ``size_rule`` take
    the text or what ``read`` made of it.  ``recognise`` gets the text and a function that parses
    it as JSON, so that only a format that needs the JSON asks for it; ``adopt`` turns what that
    function returned into what ``read`` would make of the text, so that a file told apart by its
    JSON is not parsed again for its proof (a plan of 192 GPUs: 2.5 s).
    """

    name: str  # the --format value, and the release's folder
    title: str  # "MSCCL XML", "MSCCL++ plan": what a file is, in messages
    title_with_article: str  # "MSCCL XML", "an MSCCL++ plan": the title in a sentence
    plural: str  # "MSCCL XML", "MSCCL++ plans"
    exported_name: str  # how errors name a file just exported: "the exported XML"
    unreadable: str  # what an error says of a file the prover cannot read: "is not valid MSCCL XML"
    suffixes: tuple[str, ...]  # of its files' names
    options: frozenset[str]  # the ExportOptions fields that shape it
    lowering: Callable[[Proof, ExportOptions], str]  # use lower(), which refuses the other options
    # Refuses, before the schedule is made, a request whose file stragglar would not write or the
    # executor not take, as far as N, the chunk count, the algorithm and the options tell: once,
    # with the request synth.check_request returned (see the module docstring).
    check_request: Callable[[Request, ExportOptions], None]
    max_cells: int  # (GPU, chunk) cells of the largest file written: N x chunks x instances
    file_name: Callable[[Schedule, ExportOptions], str]  # what the release names a file of it
    recognise: Callable[[str, Callable[[], object]], bool]
    adopt: Callable[[object], D] | None  # a recognised file's JSON as read's document (None: not JSON)
    read: Callable[[str | D], D]  # a document is returned as it is
    prove: Callable[[str | D], ArtifactProof]  # raises InputError (unreadable) or IncorrectError
    describe: Callable[[str | D], str]  # for show: the program in a few lines
    size_rule: Callable[[str | D], SizeRule] | None  # which buffer sizes the executor uses it for

    def max_chunks(self, num_ranks: int, options: ExportOptions) -> int:
        """The most chunks a file of ``num_ranks`` GPUs may have (what ``--chunks auto`` picks from)."""
        per_chunk = as_int(num_ranks, "num_ranks", minimum=1) * as_int(
            options.instances, "instances", minimum=1
        )
        return self.max_cells // per_chunk

    def lower(self, proof: Proof, options: ExportOptions | None = None) -> str:
        """The text of ``proof`` in this format; an option that does not shape it, set to anything
        but its default, is an :class:`~stragglar.errors.InputError`, not silently ignored."""
        options = ExportOptions() if options is None else options
        if not isinstance(options, ExportOptions):  # a dict's keys were read as attributes: AttributeError
            raise ArgumentError(
                f"options must be a stragglar.artifacts.ExportOptions, got {described(options)}"
            )
        for option in dataclasses.fields(ExportOptions):
            if option.name not in self.options and getattr(options, option.name) != option.default:
                shaped = " and ".join(f.plural for f in FORMATS.values() if option.name in f.options)
                raise InputError(f"{option.name} does not shape {self.title}: it shapes {shaped} only")
        return self.lowering(proof, options)


def format_of(text: str, document: Callable[[], object]) -> ArtifactFormat[Any] | None:
    """The format of a file's ``text`` (``document`` parses it as JSON), or None for a file of none
    of them, such as a JSON schedule."""
    return next((f for f in FORMATS.values() if f.recognise(text, document)), None)


# ---------------------------------------------------------------------------- MSCCL XML


def _lower_msccl(proof: Proof, options: ExportOptions) -> str:
    xml_options = XmlOptions(
        name=options.name,
        proto=options.proto,
        instances=options.instances,
        min_bytes=0 if options.min_bytes is None else options.min_bytes,
        max_bytes=options.max_bytes,
    )
    return msccl.lower(proof, xml_options)


def _check_msccl(request: Request, options: ExportOptions) -> None:
    msccl.check_request(request.num_ranks, request.num_chunks, options.instances, request.algorithm)


def _msccl_file(schedule: Schedule, options: ExportOptions) -> str:
    return f"{msccl.default_name(schedule, options.proto, options.instances)}.xml"


def _is_xml(text: str, document: Callable[[], object]) -> bool:
    """Markup: no JSON document starts with ``<``."""
    return text.lstrip()[:1] == "<"


MSCCL: ArtifactFormat[XmlDocument] = ArtifactFormat(
    name="msccl",
    title="MSCCL XML",
    title_with_article="MSCCL XML",
    plural="MSCCL XML",
    exported_name="the exported XML",
    unreadable="is not valid MSCCL XML",
    suffixes=(".xml",),
    options=frozenset({"name", "proto", "instances", "min_bytes", "max_bytes"}),
    lowering=_lower_msccl,
    check_request=_check_msccl,
    max_cells=msccl.MAX_XML_CELLS,
    file_name=_msccl_file,
    recognise=_is_xml,
    adopt=None,
    read=msccl.read,
    prove=msccl.prove,
    describe=msccl.describe,
    size_rule=None,
)

# ---------------------------------------------------------------------------- MSCCL++ plans


def _lower_plan(proof: Proof, options: ExportOptions) -> str:
    plan_options = PlanOptions(
        name=options.name,
        instances=options.instances,
        min_message_size=options.min_bytes,
        max_message_size=options.max_bytes,
        max_threadblocks=options.max_threadblocks,
    )
    return mscclpp.lower(proof, plan_options).text


def _check_plan(request: Request, options: ExportOptions) -> None:
    mscclpp.check_request(
        request.num_ranks, request.num_chunks, options.instances, options.max_threadblocks, request.algorithm
    )


def _plan_file(schedule: Schedule, options: ExportOptions) -> str:
    return f"{mscclpp.default_name(schedule, options.instances)}-mscclpp.json"


def _is_plan(text: str, document: Callable[[], object]) -> bool:
    """A JSON object with a ``gpus`` list that does not say it is a stragglar schedule (``format``);
    other JSON may have a ``gpus`` key (``bench --json``: the GPUs of the machine, or null)."""
    root = document()
    return isinstance(root, dict) and "format" not in root and isinstance(root.get("gpus"), list)


MSCCLPP: ArtifactFormat[PlanDocument] = ArtifactFormat(
    name="mscclpp",
    title="MSCCL++ plan",
    title_with_article="an MSCCL++ plan",
    plural="MSCCL++ plans",
    exported_name="the exported plan",
    unreadable="is not a plan stragglar can prove",
    suffixes=(".json",),
    options=frozenset({"name", "instances", "min_bytes", "max_bytes", "max_threadblocks"}),
    lowering=_lower_plan,
    check_request=_check_plan,
    max_cells=mscclpp.MAX_PLAN_CELLS,
    file_name=_plan_file,
    recognise=_is_plan,
    adopt=mscclpp.adopt,
    read=mscclpp.read,
    prove=mscclpp.prove,
    describe=mscclpp.describe,
    size_rule=mscclpp.size_rule,
)

FORMATS: Mapping[str, ArtifactFormat[Any]] = MappingProxyType({f.name: f for f in (MSCCL, MSCCLPP)})
