"""The downloadable schedules: JSON, MSCCL XML and MSCCL++ plans, each proved from its own text.

Everything here is deterministic, so a test can regenerate the top-level ``schedules/`` folder
and compare it byte for byte.  Regenerate it with ``python -m stragglar.release schedules``.
Each format lives in a folder of its own: the MSCCL executor parses every file of
``MSCCL_ALGO_DIR``, and MSCCL++ plans are JSON like our schedules.

>>> bundle = schedule_files("stragglar", 4)
>>> sorted(bundle.files)
['json/stragglar-n4-s3.json', 'msccl/stragglar-n4-s3-simple.xml', 'mscclpp/stragglar-n4-s3-mscclpp.json']
>>> bundle.rounds, bundle.lower_bound
(4, 4)
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stragglar.artifacts import FORMATS, MSCCL, MSCCLPP, ArtifactFormat, ExportOptions
from stragglar.files import write_text
from stragglar.formats import schedule_json
from stragglar.schedule import base_name, round_lower_bound
from stragglar.synth import synthesize
from stragglar.verify import prove

__all__ = [
    "CHUNKED_RELEASES",
    "MSCCL_SIZES",
    "RELEASED_SIZES",
    "ScheduleFiles",
    "schedule_files",
    "write_release",
    "write_schedule_files",
]

RELEASED_SIZES = (2, 3, 4, 5, 6, 7, 8, 16, 32, 64, 72)  # 72: one NVL72 domain
# MSCCL XML up to 64: N = 128 also fits the executor's parser limits, but its straggler runs 254
# thread blocks, more than an H100 has SMs, so larger files wait until one has run on hardware.
MSCCL_SIZES = tuple(n for n in RELEASED_SIZES if n <= 64)
# Chunked StragglAR (N, C): C is the power of two the cost model prices fastest for 1 GiB on the
# paper's network (3 us, 450 GiB/s) with phase 1 hidden; a power of two so that executors split
# power-of-two buffers evenly, which they never do with the paper's N - 1 chunks.
CHUNKED_RELEASES = ((4, 32), (8, 32), (16, 64))


@dataclass(frozen=True)
class ScheduleFiles:
    """Path under the release folder -> text, and the facts a table of released schedules lists."""

    files: dict[str, str]
    algorithm: str
    num_ranks: int
    num_chunks: int
    straggler: int | None
    rounds: int  # rounds after the straggler arrives (all rounds without a straggler)
    lower_bound: int | None  # C + ceil(log2 N) - 1 for StragglAR: R*(N) with the paper's C = N - 1
    proto: str
    instances: int
    proofs: tuple[str, ...]  # the JSON schedule's proof summary, then each artifact's


def schedule_files(
    algorithm: str,
    num_ranks: int,
    *,
    straggler: int | None = None,
    chunks: int | None = None,
    proto: str = "Simple",
    instances: int = 1,
    msccl: bool = True,
) -> ScheduleFiles:
    """Synthesize one schedule, prove it from its JSON text, export that proof (MSCCL XML in
    ``proto`` and ``instances`` if ``msccl``, and an MSCCL++ plan with the default options) and
    prove each artifact from its own text; each format's files go to a folder of its name."""
    schedule = synthesize(algorithm, num_ranks, straggler, chunks=chunks)
    json_text = schedule_json.dumps(schedule) + "\n"
    proof = prove(schedule_json.loads(json_text))
    files = {f"json/{base_name(schedule)}.json": json_text}
    proofs = [proof.summary]
    exports: list[tuple[ArtifactFormat[Any], ExportOptions]] = [
        *([(MSCCL, ExportOptions(proto=proto, instances=instances))] if msccl else []),
        (MSCCLPP, ExportOptions()),
    ]
    for fmt, options in exports:
        text = fmt.lower(proof, options)
        files[f"{fmt.name}/{fmt.file_name(schedule, options)}"] = text
        proofs.append(fmt.prove(text).summary)
    return ScheduleFiles(
        files,
        algorithm,
        num_ranks,
        schedule.num_chunks,
        schedule.straggler,
        schedule.exposed_rounds,
        round_lower_bound(num_ranks, schedule.num_chunks) if algorithm == "stragglar" else None,
        proto,
        instances,
        tuple(proofs),
    )


def write_schedule_files(directory: str | os.PathLike[str], bundle: ScheduleFiles) -> list[Path]:
    """Write ``bundle``'s files under ``directory`` (folders created as needed); the paths, sorted."""
    paths = []
    for name, text in sorted(bundle.files.items()):
        path = Path(directory) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text(path, text)
        paths.append(path)
    return paths


def write_release(
    directory: str | os.PathLike[str],
    sizes: tuple[int, ...] = RELEASED_SIZES,
    chunked: tuple[tuple[int, int], ...] = CHUNKED_RELEASES,
) -> list[Path]:
    """Write the StragglAR files for ``sizes`` and the ``chunked`` (N, C), and a README table."""
    folder = Path(directory)
    bundles = [schedule_files("stragglar", n, msccl=n in MSCCL_SIZES) for n in sizes]
    bundles += [schedule_files("stragglar", n, chunks=c, msccl=n in MSCCL_SIZES) for n, c in chunked]
    paths = [path for bundle in bundles for path in write_schedule_files(folder, bundle)]
    readme = folder / "README.md"
    write_text(readme, _readme(bundles))
    return [*paths, readme]


def _readme(bundles: list[ScheduleFiles]) -> str:
    def link(bundle: ScheduleFiles, folder: str) -> str:
        names = [name for name in bundle.files if name.startswith(f"{folder}/")]
        return " ".join(f"[{Path(name).name}]({name})" for name in names) or "-"

    rows = [
        f"| {b.num_ranks} | {b.num_chunks} | {b.rounds} | {b.lower_bound} | "
        + " | ".join(link(b, folder) for folder in ("json", *FORMATS))
        + " |"
        for b in bundles
    ]
    return "\n".join(
        [
            "# Ready StragglAR schedules",
            "",
            "Generated by `python -m stragglar.release schedules`; every file was proved from its own",
            "text (the JSON by the symbolic simulator, the MSCCL XML as the MSCCL executor runs it, the",
            "MSCCL++ plan as the MSCCL++ executor runs it). The straggler is the last rank;",
            "`stragglar synth --gpus N --straggler R -o x.xml` (or `--format mscclpp -o plan.json`) makes",
            "any other. C is the chunk count: the paper's N - 1, or (files named `-c<C>`) a power of",
            "two, which executors can use for power-of-two buffers (`--chunks C|auto` makes others).",
            "Rounds are those after the straggler arrives; the bound is C + ceil(log2 N) - 1 (R*(N) for",
            "C = N - 1). MSCCL XML (Simple protocol) is shipped up to N = 64.",
            "",
            "| N | C | rounds | bound | JSON schedule | "
            + " | ".join(f.title for f in FORMATS.values())
            + " |",
            "|---:|---:|---:|---:|---|" + "---|" * len(FORMATS),
            *rows,
            "",
        ]
    )


def main(argv: list[str] | None = None) -> None:
    """``python -m stragglar.release [FOLDER]``: write the release into FOLDER (default
    ``schedules``) and name each file written.  ``--help`` says so; it used to be taken for the
    folder's name, and the release written into ``./--help``."""
    parser = argparse.ArgumentParser(
        prog="python -m stragglar.release",
        description="Write the downloadable schedules (JSON, MSCCL XML, MSCCL++ plans, each proved) "
        "and their README table into FOLDER.",
    )
    parser.add_argument("folder", nargs="?", default="schedules", metavar="FOLDER", help="default: schedules")
    folder = Path(parser.parse_args(argv).folder)
    if folder.exists() and not folder.is_dir():
        parser.error(f"{folder} is not a folder")
    for written in write_release(folder):
        print(written)


if __name__ == "__main__":
    main()
