"""The paper's forgetting methods B0-B9 beside our exact ones (``baselines``):
each acts on a fork of the runtime through its public verbs, and ``get_method``
accepts a slug or the paper's B-number."""
