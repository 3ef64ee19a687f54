"""The lab beside the suite: benchmarks, the experiment driver and its verdicts, the memory soak's readings.

It holds what the project measures itself with, not what a user trains or decodes with:
``--user-dir fairseq_plugins`` and ``import fairseq_plugins`` never import it.

* :mod:`.benchmarks`: ``fairseq-plugins-benchmark`` and its sub-commands, with the project's speed targets;
* :mod:`.experiment`: the small experiment driver of the quickstart, the paper-claims and parity runs;
* :mod:`.claims`: the verdict rule on the papers' claims over seeds;
* :mod:`.memory`: RSS samples and their verdict (``scripts/soak.sh``).
"""
