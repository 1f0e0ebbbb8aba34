"""Command-line types the benchmarks share: argparse prints their reason in one line, exit 2."""

from __future__ import annotations

import argparse

from stragglar.errors import InputError
from stragglar.measure.links import check_link_rate
from stragglar.units import parse_bandwidth


def link_rate(text: str) -> float:
    """``--link-rate``: a bandwidth ("200MB/s") that a paced link can have."""
    try:
        return check_link_rate(parse_bandwidth(text))
    except InputError as e:  # argparse shows an ArgumentTypeError's own words
        raise argparse.ArgumentTypeError(str(e)) from None
