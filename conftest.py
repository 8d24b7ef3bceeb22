"""Hypothesis settings profiles, chosen by the UNSEE_PROFILE variable.

- ``ci``: bounded and deterministic (derandomized), the default under CI=true;
- ``dev``: the default on a workstation, same bounds but randomized;
- ``nightly``: large example counts for the long runs.
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
    "nightly",
    max_examples=2000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

_default = "ci" if os.environ.get("CI") else "dev"
settings.load_profile(os.environ.get("UNSEE_PROFILE", _default))


#: Collected first: the engine-level properties are fast and name the verb
#: that broke, so a broken engine fails in seconds, before any episode runs.
FIRST = "properties/prop_engine_verbs.py"


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=lambda item: not item.nodeid.startswith(FIRST))  # stable: the rest keep their order
