"""Side-by-side benchmarks of the suite's models against fairseq's built-ins.

* :mod:`.presets`: model sizes, the pairs' flags, the synthetic data;
* :mod:`.measure`: training tokens/s, generation sentences/s, peak memory, matmul ceiling;
* :mod:`.flops`: the FLOP formulas added to torch's counter;
* :mod:`.harness`: fresh processes, the time budget, interleaved repeats;
* :mod:`.report`: the markdown report;
* :mod:`.scale`: ``fairseq-train`` throughput over processes × precision × model;
* :mod:`.engines`: ``fairseq-generate`` vs exported engines on a test split, speed and BLEU;
* :mod:`.ctranslate2`, :mod:`.onnx`: those engines, CTranslate2 and ONNX Runtime float32/int8 exports;
* :mod:`.serve`: the server under concurrent clients, batched vs not.

The command lines are ``fairseq-plugins-benchmark`` (``--onnx``: :mod:`.onnx`),
``fairseq-plugins-benchmark-scale``, ``fairseq-plugins-benchmark-ctranslate2`` (``--engine
ctranslate2 onnx``) and ``fairseq-plugins-benchmark-serve``.
"""
