"""Small helpers every subsystem may use: ``text`` (normalisation and the leak
variants of a value), ``residue`` (where a forgotten value still stands in kept
bytes: the one matcher of ``unsee verify`` and conformance), ``exclusive`` (one
transition or forget at a time per session), ``progress`` (the one progress-bar
helper), ``modules`` (which optional packages this install can import),
``build`` (the git commit a run's rows name)."""
