"""The suite's order and the Hypothesis settings profiles.

Order: fast, specific checks first. Collected tests run in four tiers, so
that a bug in one subsystem fails that subsystem's quick check within
seconds, before the slow end-to-end runs start:

- tier 0, structure and the pure spec: the architecture and API tests, the
  spec's properties (``properties/prop_spec*.py``) and the z3 proofs;
- tier 1, fast unit checks per subsystem: the engine verbs on every engine,
  the KV engine and budget eviction, the hostile-schema property, verify's
  rebuild, the AgentDojo attack span, then the episode format, the runtime, its
  rendering, metrics and stats;
- tier 2, everything not named in :data:`TIERS`;
- tier 3, slow end-to-end runs: SmolLM2 (the ``smollm2`` marker), the
  evaluation runs, concurrency and crash windows, the paper tables, the
  subprocess memory check, and the benches.

:data:`TIERS` names the tests of tiers 0, 1 and 3 by node-id prefix; the
longest prefix that matches decides, and a test marked ``smollm2`` is tier 3
wherever it sits. Inside a tier the entries run in the listed order (the
seeded-bug checks of issue 19 first in tier 1), each entry's tests, and all
of tier 2, in pytest's own order.

Hypothesis profiles, chosen by the UNSEE_PROFILE variable:

- ``ci``: bounded and deterministic (derandomized), the default under CI=true;
- ``dev``: the default on a workstation, same bounds but randomized;
- ``nightly``: large example counts for the long runs;
- ``flake``: the ``ci`` bounds, randomized from ``--hypothesis-seed`` (``make
  flake`` runs the suite under it several times, a fresh seed each run, and
  reports every test that failed in any run: tests/flake_report.py).
"""

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=60,
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "dev",
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "flake",
    max_examples=60,
    deadline=None,
    print_blob=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "nightly",
    max_examples=2000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

_default = "ci" if os.environ.get("CI") else "dev"
settings.load_profile(os.environ.get("UNSEE_PROFILE", _default))


#: Node-id prefixes of tiers 0, 1 and 3, in their run order (see the module
#: docstring); the rest is tier 2.
TIERS: dict[int, tuple[str, ...]] = {
    0: ("tests/test_architecture.py", "tests/test_api.py", "properties/prop_spec", "proofs/"),
    1: (
        # engines: every verb on every engine (names the verb that broke), then budget eviction
        "properties/prop_engine_verbs.py", "tests/test_kv_engine.py", "tests/test_runtime_budget.py",
        # drafts: each guard site needed at its own site
        "properties/prop_guard_sites.py",
        # store: the hostile-schema property, verify's rebuild
        "properties/prop_store_hostile.py", "tests/test_verify.py",
        # eval: the AgentDojo attack span
        "tests/test_suites_agentdojo.py",
        # the other fast unit checks: KV engine, llama.cpp parts, episode format, runtime, metrics and stats
        "tests/test_kv.py", "tests/test_llamacpp.py", "tests/test_episode_format.py", "tests/test_runtime.py",
        "tests/test_render.py", "tests/test_metrics_stats.py",
    ),
    3: (
        "tests/test_kv_engine.py::test_engine_keeps_freed_host_memory_for_reuse",  # two torch subprocesses
        "properties/prop_impl_smollm2.py", "tests/test_eval.py", "tests/test_concurrency.py",
        "tests/test_residue_window.py", "tests/test_bench_paper.py", "tests/test_realmodel.py", "bench/",
    ),
}


def get_run_order(nodeid: str, is_smollm2: bool) -> tuple[int, int]:
    """``(tier, entry)`` of a test: the tier and the place in it of the longest
    :data:`TIERS` prefix of its node id; tier 2 without one, tier 3 if marked ``smollm2``."""
    if is_smollm2:
        return (3, 0)
    matches = [(len(prefix), tier, entry) for tier, prefixes in TIERS.items()
               for entry, prefix in enumerate(prefixes) if nodeid.startswith(prefix)]
    if not matches:
        return (2, 0)
    _, tier, entry = max(matches)
    return (tier, entry)


def pytest_collection_modifyitems(session, config, items):
    # sort is stable: tests with one (tier, entry) keep pytest's order
    items.sort(key=lambda item: get_run_order(item.nodeid, item.get_closest_marker("smollm2") is not None))
