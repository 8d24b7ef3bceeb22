"""unsee: exact, cheap, provable forgetting for stateful LLM agents.

The package is one namespace over the project's top-level folders:

- ``unsee.spec``        (spec/)        pure reference transition system, no torch;
- ``unsee.impl``        (impl/)        the runtime on HF Transformers;
- ``unsee.properties``  (properties/)  Hypothesis strategies and properties;
- ``unsee.proofs``      (proofs/)      z3 proofs of the paper's statements;
- ``unsee.bench``       (bench/)       efficiency benchmarks.
"""

__version__ = "0.1.0"
