"""The paper's forgetting methods B0-B9 beside our exact ones (``baselines``):
each acts on a fork of the runtime through its public verbs, and ``get_method``
accepts a slug or the paper's B-number; and the compute floor any exact forget
is measured against (``floor``: counted from the counterfactual, timed as a raw
run of its operations)."""
