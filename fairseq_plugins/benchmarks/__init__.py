"""Side-by-side benchmarks of the suite's models against fairseq's built-ins.

* :mod:`.presets`: model sizes, the pairs' flags, the synthetic data;
* :mod:`.measure`: training tokens/s, generation sentences/s, peak memory, matmul ceiling;
* :mod:`.flops`: the FLOP formulas added to torch's counter;
* :mod:`.harness`: fresh processes, the time budget, interleaved repeats;
* :mod:`.report`: the markdown report;
* :mod:`.scale`: ``fairseq-train`` throughput over processes × precision × model;
* :mod:`.ctranslate2`: ``fairseq-generate`` vs CTranslate2 float32/int8 exports, speed and BLEU.

The command lines are ``fairseq-plugins-benchmark``, ``fairseq-plugins-benchmark-scale`` and
``fairseq-plugins-benchmark-ctranslate2``.
"""
