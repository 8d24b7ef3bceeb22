"""The ``unsee`` command: ``main`` dispatches through one table to one function
per subcommand (``run``, ``stored``: forget/show/verify, ``demo``, ``evaluate``:
eval/conform, ``calibrate``); ``parser`` and ``options`` build the arguments, one spelling per
concept; ``exits`` is the one exit-code table; ``docs`` writes the README's
command-line table from the parser (``python -m unsee.impl.cli.docs --write``)."""
