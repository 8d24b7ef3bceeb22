"""Conformance: check any implementation against the paper's claims (docs/conformance.md).

``contract``       the contract's name, version, the fields an answer may hold, and the reference engine
``answers``        reading an answer strictly: another version or an undefined field is refused (exit 2)
``harness``        run generated episodes and their counterfactuals through an
                   implementation, compare, shrink a failure to an episode file
``checks``         the named checks, and those for what stays behind (residue,
                   reopen, idempotent, effects once); N/A where one cannot be answered
``ci``             searching on to ``--max-failures``, failing cases as replayable folders
``report``         JUnit XML and JSON reports (one test case per episode x check)
``vectors``        versioned test vectors: written by the reference, checked without torch
``suite``          the suite's releases (a vectors folder per version, its checks, digests) and the tiers
``release``        making a release: the attended-span episodes, the folder and its manifest
``result``         a run's result.json and badge.svg, and an adopter's baseline of expected failures
``results``        docs/results.md from committed result files, each re-verified from its cases
``claims``         each scored framework's documented promise about deletion, and its verdict
``pytest_plugin``  the ``pytest11`` plugin (``pytest --unsee-entry MODULE:FUNCTION``)
``episodes``       the episode generator (Hypothesis strategies; the properties use it too)
``adapters``       shipped implementations: the reference, and broken ones the harness must reject
"""
