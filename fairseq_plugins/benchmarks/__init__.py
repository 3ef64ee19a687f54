"""Side-by-side benchmarks of the suite's models against fairseq's built-ins.

* :mod:`.presets`: model sizes, the pairs' flags, the synthetic data;
* :mod:`.measure`: training tokens/s, generation sentences/s, peak memory, matmul ceiling;
* :mod:`.flops`: the FLOP formulas added to torch's counter;
* :mod:`.harness`: fresh processes, the time budget, interleaved repeats;
* :mod:`.report`: the markdown report;
* :mod:`.scale`: ``fairseq-train`` throughput over processes × precision × model.

The command lines are ``fairseq-plugins-benchmark`` and ``fairseq-plugins-benchmark-scale``.
"""
