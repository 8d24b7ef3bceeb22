"""The executable specification: a pure-functional reference transition system.

Short pure functions over attrs frozen data, no torch. Prefixes mean what they
say: ``is_``/``has_`` predicates, ``get_`` look-ups, ``compute_`` arithmetic,
``apply_``/``add_`` state updates; the statements of the paper live in
:mod:`unsee.spec.statements` under one name each.
"""

from .environment import (
                          CommittedEffect,
                          Run,
                          apply_effects,
                          get_environment_at,
                          get_replay_environment,
                          get_snapshot,
                          record_observations,
                          replay_tools,
)
from .provenance import (
                          Artifact,
                          ProvenanceGraph,
                          add_artifact,
                          build_conservative_graph,
                          build_selective_graph,
                          first_entry_turn,
                          get_certified_clean_set,
                          get_influence_set,
                          get_prefix_graph,
                          get_reachable,
                          locate_source,
)
from .splice import (
                          AssumptionReport,
                          SpliceResult,
                          compute_gain,
                          compute_replay_invocations,
                          full_reset,
                          get_restore_boundary,
                          has_no_committed_effects_after,
                          is_deterministic,
                          is_recording_reproducible,
                          is_sanitized_counterfactual,
                          run_session,
                          splice,
)
from .statements import (
                          certified_clean_is_prefix,
                          influence_is_monotone,
                          prefix_is_shared,
                          replay_cost_is_optimal,
                          replay_cost_is_suffix_length,
                          splice_equals_counterfactual,
)
from .transition import (
                          OBSERVATION_KINDS,
                          InvocationCounter,
                          Item,
                          Observation,
                          StepFunction,
                          counterfactual_stream,
                          counterfactual_trajectory,
                          draw_unseeded_entropy,
                          first_entry,
                          is_item_of,
                          remove_item,
                          sanitize_observation,
                          trajectory,
)

__all__ = [name for name in dir() if not name.startswith("_")]
