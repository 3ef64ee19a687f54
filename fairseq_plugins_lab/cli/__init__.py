"""``fairseq-plugins-benchmark`` and its sub-commands (:mod:`.benchmark`), one module each."""
