"""Drafts under a calibrated bound (``unsee calibrate``, engines/bounds.py) keep forget exact.

=============================================  ================================================================
test                                           checks
=============================================  ================================================================
calibrated_bound_turns_drafts_on               a configuration with no shipped bound (tiny, bf16, each of
                                               unsee_eager and sdpa) has drafts off until calibrated; after
                                               ``unsee calibrate`` its engines read the bound from the cache
                                               folder and say so
forget_equals_reset_with_calibrated_drafts     forget with drafts under the calibrated bound == full reset
                                               (digest, every token id), greedy and seeded sampling, tiny in
                                               bf16 on the CPU with ``unsee_eager`` and with ``sdpa``
=============================================  ================================================================

The calibration here is small (3 turns of 24 tokens, one thread) to keep ``ci`` short;
``nightly`` runs 2,000 / 6 (333) examples per attention. docs/drafts.md ("Calibrated bounds") has
the nightly figures and the full calibrations' commands.
"""

from __future__ import annotations

import argparse
import functools
import tempfile

import pytest
from hypothesis import event, given

from unsee.impl.cli.calibrate import calibrate
from unsee.impl.conform.episodes import episodes, scaled
from unsee.properties.differential import compare_forget_with_reset, engine_scope
from unsee.properties.engines import make_engine

pytestmark = pytest.mark.usefixtures("one_thread")

ATTNS = ("unsee_eager", "sdpa")
DTYPE = "bfloat16"


@functools.cache
def get_cache_dir() -> str:
    """One calibration folder per process (removed with the process's temporary files)."""
    return tempfile.mkdtemp(prefix="unsee-calibrated-")


@functools.cache
def get_calibration(attn: str) -> dict:
    args = argparse.Namespace(model="tiny", device="cpu", dtype=DTYPE, attn=attn, prompts=3, tokens=24,
                              cache_dir=get_cache_dir())
    return calibrate(args, [1])


def get_engine(attn: str):
    get_calibration(attn)
    return make_engine("tiny", dtype=DTYPE, attn=attn, cache_dir=get_cache_dir())


@pytest.mark.parametrize("attn", ATTNS)
def test_calibrated_bound_turns_drafts_on(attn, tmp_path):
    uncalibrated = make_engine("tiny", dtype=DTYPE, attn=attn, cache_dir=str(tmp_path))
    assert uncalibrated.draft_bound is None and uncalibrated.draft_bound_source.startswith("none")
    record = get_calibration(attn)
    engine = get_engine(attn)
    assert engine.draft_bound == record["bound"] == record["in_force"]
    assert engine.draft_bound >= 10 * max(record["measured_max"], record["resolution"])
    assert engine.draft_bound_source == f"calibrated: {record['path']}"


drafted_episodes = functools.partial(episodes, min_steps=2, max_steps=6, max_new_tokens=(2, 8))


@pytest.mark.parametrize("attn", ATTNS)
@given(episode=drafted_episodes())
@scaled(6)
def test_forget_equals_reset_with_calibrated_drafts(attn, episode):
    engine = get_engine(attn)
    with engine_scope(engine):
        report = compare_forget_with_reset(engine, episode, drafts=True)
    assert report.drafts.mode == "verify" and report.drafts.bound == engine.draft_bound
    assert report.drafts.bound_source.startswith("calibrated: ")
    totals = report.drafts.totals
    event(f"draft tokens accepted: {totals['accepted'] > 0}")
    event(f"a guard fallback: {totals['fallbacks'] > 0}")
