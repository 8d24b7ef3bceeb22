"""Sessions on disk (docs/persistence.md).

``schema``   the SQLite schema, pragmas and the store's errors
``records``  the session record in canonical form, its hash, token packing, the residue audit
``sqlite``   :class:`~sqlite.SessionStore`: open, save, load, crash-atomic commits
``session``  :class:`~session.PersistentSession`: a runtime whose every step and forget is committed
``backend``  which engine made a stored session (backend, model, options), rebuilt through the registry
``receipt``  the erasure receipt a forget writes
``verify``   rebuild the counterfactual from a store and check a receipt against it
"""
