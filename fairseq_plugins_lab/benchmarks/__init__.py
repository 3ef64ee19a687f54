"""Side-by-side benchmarks of the suite's models against fairseq's built-ins.

* :mod:`.presets`: model sizes, the pairs' flags, the synthetic data;
* :mod:`.measure`: training tokens/s, generation sentences/s, peak memory, matmul ceiling;
* :mod:`.flops`: the FLOP formulas added to torch's counter;
* :mod:`.harness`: fresh processes, the time budget, interleaved repeats;
* :mod:`.report`: the markdown report;
* :mod:`.scale`: ``fairseq-train`` throughput over processes × precision × model;
* :mod:`.engines`: ``fairseq-generate`` vs exported engines on a test split, speed and BLEU, the
  one timing of every engine (``EXPORTS``);
* :mod:`.ctranslate2`, :mod:`.onnx`: those engines, CTranslate2 and ONNX Runtime float32/int8 exports;
* :mod:`.serve`: the server under concurrent clients, batched vs not.

The command line is ``fairseq-plugins-benchmark`` (:mod:`fairseq_plugins_lab.cli.benchmark`) with
the sub-commands ``models`` (the default; ``--onnx``, ``--ctranslate2``: :mod:`.engines` on the
models it trained), ``engines`` (``--engine ctranslate2 onnx`` on given checkpoints; also installed
as ``fairseq-plugins-benchmark-ctranslate2``), ``scale`` (``fairseq-plugins-benchmark-scale``) and
``serve`` (``fairseq-plugins-benchmark-serve``). The suite's speed targets: :mod:`.report`.
"""
