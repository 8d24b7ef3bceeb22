"""The paper's evaluation (docs/eval.md).

``cases``, ``suites``, ``agentdojo``  the evaluation cases and their seeded generators
``run``      every method on every case, rows as resumable JSONL (``rows``: the file,
           ``workers``: the worker processes, ``archive``: the rows kept across sittings)
``metrics``  leaks, actions, CAD, utility, efficiency; ``audit`` the probes and leak search
``stats``    paired tests; ``report`` the tables and plots; ``paper`` the paper's own figures
"""
