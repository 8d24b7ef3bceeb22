"""Conformance: check any implementation against the paper's claims (docs/conformance.md).

``contract``  the contract's name, version and reference engine
``harness``   run generated episodes and their counterfactuals through an
              implementation, compare, shrink a failure to an episode file
``episodes``  the episode generator (Hypothesis strategies; the properties use it too)
``adapters``  shipped implementations: the reference, and broken ones the harness must reject
"""
