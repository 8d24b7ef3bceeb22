"""The agent runtime: ``R_t = F(R_{t-1}, o_t)`` and ``forget`` (Algorithm 1).

``runtime``     :class:`~runtime.AgentRuntime`: the transition ``F`` per observation,
                the public verbs baselines use (``append_block``, ``rebuild_context``...)
``state``       ``R_t`` as one value (:class:`~state.RuntimeState`): fork, restore and
                adopt are one evolve each; its graph and checkpoints are values too
``forget``      Algorithm 1 (Provenance-Guided Selective Replay) and B5, the full reset
``report``      :class:`~report.ForgetReport`: what a forget did and cost
``render``      how observations and turns become prompt text: the model's chat
                template (``templates``: per-turn segments, checked append-only), or ChatML
``episode``     the episode format: steps, items, settings, targets
``provenance``  the artifact graph (persistent): blocks, sources, taint closure, ``first_entry``
``checkpoints`` metadata-only checkpoints (a persistent store) and the checkpoint policies
``drafts``      replay of model turns as verified drafts, probes, context guesses
``extensions``  the protocol of components a runtime owns; ``loading`` rebuilds a
                runtime and its extensions from a session record
``tools/``      the tool layer (an extension): calls, environment snapshots,
                shadow execution with call-ID de-duplication (assumption A3)
"""
