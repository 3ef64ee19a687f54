"""Write a checkpoint of any family as an ONNX Runtime folder.

    fairseq-plugins-export-onnx CHECKPOINT OUT_DIR [--data DIR] [--force] [--quantize int8 | int8-weights]
        [--bpe-codes FILE | --sentencepiece-model FILE] [--beam N --lenpen P --max-len-b N]

The folder holds

* ``encoder.onnx`` (``src_tokens`` [B, S], left-padded, ending in ``</s>`` -> the decoder's
  initial state) and ``decoder_step.onnx`` (``prev_token`` [B, 1] and the state -> ``log_probs``
  [B, V], the new state but the encoder's, which it reads and does not change (``constant_state``
  in config.json), and, for RNNsearch and the Transformer, ``attention`` [B, S]): the
  programs of :func:`fairseq_plugins.export.torch_export.export_model`, the models' own code,
  converted by ``torch.onnx.export(..., dynamo=True)``; batch, source and target lengths dynamic;
* ``source_vocabulary.json`` / ``target_vocabulary.json``: fairseq's dictionaries in index order;
* the subword model (``bpe.codes`` or ``sentencepiece.model``) when one is named;
* ``config.json``: the state's names, the special ids, the decoding settings (beam, lenpen,
  max-len-b, the decoder's position limit) and the preprocessing;
* ``fairseq_plugins_onnx.py``, the runtime (numpy + onnxruntime), and the web page
  (:mod:`fairseq_plugins.export.onnx_web`).

``--quantize int8`` makes every MatMul by a weight matrix an int8 product (onnxruntime's dynamic
quantization: int8 weights, one scale per matrix, 7 bits of range; each call's input rounded to 8
bits with its own range; int32 sums): what CTranslate2's and ``--quantize-decoding int8``'s int8
do, and what the CPU's int8 dot products (VNNI, AMX) speed up. ``--quantize int8-weights`` keeps
float32 arithmetic and stores int8 weights (weight-only ``MatMulNBits``, asymmetric blocks of 16):
smaller graphs, slower decoding. docs/ONNX.md has the measurements behind both.
"""
import json
import logging
import os
import shutil
import warnings
from typing import Optional

import fairseq_plugins_onnx

from fairseq_plugins.errors import ConfigError
from fairseq_plugins.export import onnx_web
from fairseq_plugins.export.common import (architecture, build_model, check_output, model_family, model_options,
                                           read_checkpoint, staged_folder)

FAMILIES = ("vaswani_transformer", "rnnsearch", "rnnencdec", "seq2seq_lstm")
QUANTIZATIONS = ("int8", "int8-weights")
SUBWORD_FILES = {"subword_nmt": "bpe.codes", "sentencepiece": "sentencepiece.model"}


def check_exportable(state: dict, checkpoint: str):
    """(arch, family) of the checkpoint (``state``, read from ``checkpoint``), or a one-line refusal
    of another family."""
    options = model_options(state, checkpoint)
    return architecture(options), model_family(options, checkpoint, FAMILIES, "ONNX")


def _check_options(bpe_codes, sentencepiece_model, quantize, beam, lenpen, max_len_b):
    if bpe_codes is not None and sentencepiece_model is not None:
        raise ConfigError("--bpe-codes and --sentencepiece-model: name one subword model, not both")
    for path, flag in ((bpe_codes, "--bpe-codes"), (sentencepiece_model, "--sentencepiece-model")):
        if path is not None and not os.path.isfile(path):
            raise ConfigError(f"{flag} {path}: no such file")
    if quantize is not None and quantize not in QUANTIZATIONS:
        raise ConfigError(f"--quantize {quantize}: not one of {', '.join(QUANTIZATIONS)}")
    if beam < 1:
        raise ConfigError(f"--beam {beam}: must be >= 1")
    if max_len_b < 1:
        raise ConfigError(f"--max-len-b {max_len_b}: must be >= 1")
    if lenpen != lenpen:
        raise ConfigError(f"--lenpen {lenpen}: not a number")


def write_graphs(model, out_dir: str) -> dict:
    """``encoder.onnx`` and ``decoder_step.onnx`` of ``model``; returns their interface for config.json."""
    import torch

    from fairseq_plugins.export.torch_export import SLOTS, export_model, state_kinds

    for name in ("onnx_ir", "onnxscript", "torch.onnx"):  # a line per graph pass at INFO
        logging.getLogger(name).setLevel(logging.WARNING)
    # four warnings per graph that torchvision's detection ops are not registered: no model uses them
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    kinds = {**state_kinds(model), SLOTS: "slots"}
    names = list(kinds)
    encoder, step = export_model(model, attention=True, beams=True)
    attention = len(step.graph_signature.user_outputs) == 2 + len(names)  # the families with attention
    step_outputs = ["log_probs", *(f"next.{name}" for name in names)] + (["attention"] if attention else [])
    for program, path, inputs, outputs in (
            (encoder, "encoder.onnx", ["src_tokens"], names),
            (step, "decoder_step.onnx", ["prev_token", *names], step_outputs)):
        # with autograd on, decomposing the LSTM encoder's scan fails in torch 2.13
        with torch.no_grad(), warnings.catch_warnings():
            # torch's exporter copies its own tree specs through an API it deprecated (torch 2.13)
            warnings.filterwarnings("ignore", r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning)
            torch.onnx.export(program, (), os.path.join(out_dir, path), dynamo=True, input_names=inputs,
                              output_names=outputs, external_data=False, verbose=False)
    constant = [name for name, kind in kinds.items() if kind == "sentences"]
    _drop_outputs(os.path.join(out_dir, "decoder_step.onnx"), [f"next.{name}" for name in constant])
    return {"state": names, "state_kinds": kinds, "attention": attention}


def _drop_outputs(path: str, names) -> None:
    """Remove outputs from a graph, and the nodes that computed only them: the step returns the
    encoder's state unchanged, and copying it out at every step took 19% of the CPU time of the
    cpu-preset RNNsearch (200 sentences, beam 4)."""
    import onnx

    graph_model = onnx.load(path)
    graph = graph_model.graph
    for output in [o for o in graph.output if o.name in names]:
        graph.output.remove(output)
    while True:
        used = {o.name for o in graph.output} | {i for node in graph.node for i in node.input}
        dead = [node for node in graph.node if not any(o in used for o in node.output)]
        if not dead:
            break
        for node in dead:
            graph.node.remove(node)
    onnx.save(graph_model, path)


def matrix_vector_products_as_matrix_products(path: str) -> None:
    """``MatMul(x, v)`` with ``v`` a 1-D weight -> ``Squeeze(MatMul(x, v as an (n, 1) matrix), -1)``:
    the same values, but onnxruntime's CPU MatMul took 4.7x longer for the vector (RNNsearch's
    ``v_aᵀ tanh(·)``: a quarter of its step's time)."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    graph_model = onnx.load(path)
    graph = graph_model.graph
    vectors = {i.name: i for i in graph.initializer if len(i.dims) == 1}
    columns = {}
    for position, node in reversed(list(enumerate(graph.node))):
        if node.op_type != "MatMul" or node.input[1] not in vectors:
            continue
        name = node.input[1]
        if name not in columns:
            columns[name] = numpy_helper.from_array(numpy_helper.to_array(vectors[name])[:, None], f"{name}.column")
        product = f"{node.output[0]}.column"
        squeeze = helper.make_node("Squeeze", [product, "fairseq_plugins.last_axis"], [node.output[0]], name=f"{node.name}.squeeze")
        node.input[1], node.output[0] = columns[name].name, product
        graph.node.insert(position + 1, squeeze)
    if columns:
        graph.initializer.extend([*columns.values(), numpy_helper.from_array(np.array([-1], dtype=np.int64), "fairseq_plugins.last_axis")])
        used = {i for node in graph.node for i in node.input}
        for name in columns:
            if name not in used:
                graph.initializer.remove(vectors[name])
    onnx.save(graph_model, path)


def transposes_of_the_last_axes(path: str) -> None:
    """``Reshape(Transpose(Reshape(x, [-1, a, b]), [0, 2, 1]), [..., b, a])`` -> ``Transpose(x)``
    of its last two axes: the exporter's lowering of ``scaled_dot_product_attention`` swaps the
    keys' last axes through 3-D reshapes, which onnxruntime does not fold into the MatMul that
    follows (as it folds a plain Transpose), so every step copied the Transformer's keys (15% of
    its node time). Rewritten only where inferred shapes prove the two equal."""
    import onnx
    from onnx import helper

    graph_model = onnx.load(path)
    graph = graph_model.graph
    inferred = onnx.shape_inference.infer_shapes(graph_model, data_prop=True).graph
    shapes = {v.name: [d.dim_param or d.dim_value or None for d in v.type.tensor_type.shape.dim]
              for v in (*inferred.value_info, *inferred.input, *inferred.output) if v.type.tensor_type.HasField("shape")}
    producer = {output: node for node in graph.node for output in node.output}
    consumers = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    for node in list(graph.node):
        if node.op_type != "Transpose" or [list(a.ints) for a in node.attribute if a.name == "perm"] != [[0, 2, 1]]:
            continue
        before, after = producer.get(node.input[0]), consumers.get(node.output[0], [])
        if before is None or before.op_type != "Reshape" or len(after) != 1 or after[0].op_type != "Reshape":
            continue
        x, merged, out = (shapes.get(name) for name in (before.input[0], before.output[0], after[0].output[0]))
        if (not x or not merged or not out or None in x or len(x) < 3
                or merged[1:] != x[-2:] or out != x[:-2] + [x[-1], x[-2]]):
            continue
        rank = len(x)
        swap = helper.make_node("Transpose", [before.input[0]], [after[0].output[0]], name=f"{node.name}.last_axes",
                                perm=[*range(rank - 2), rank - 1, rank - 2])
        graph.node.insert(list(graph.node).index(after[0]), swap)
        graph.node.remove(after[0])
        graph.node.remove(node)
        gone = [node.output[0]]
        if len(consumers[before.output[0]]) == 1:
            graph.node.remove(before)
            gone.append(before.output[0])
        for info in [v for v in graph.value_info if v.name in gone]:
            graph.value_info.remove(info)
    onnx.save(graph_model, path)


def transposed_weights(path: str) -> None:
    """``Transpose(W)`` of a weight -> a weight stored transposed: the exporter transposes a
    weight shared by two modules (the Transformer's output projection, tied to its embeddings) in
    the graph. onnxruntime folds it when it loads the graph, but the int8 quantization, which
    runs before, sees a MatMul by an activation and kept the output projection float32 (6.6% of
    the int8 step's node time at base widths, docs/ONNX.md)."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    graph_model = onnx.load(path)
    graph = graph_model.graph
    weights = {w.name: w for w in graph.initializer}
    for node in [n for n in graph.node if n.op_type == "Transpose" and n.input[0] in weights]:
        perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
        value = np.transpose(numpy_helper.to_array(weights[node.input[0]]), perm)
        graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(value), node.output[0]))
        graph.node.remove(node)  # W stays: the embedding reads it too
    onnx.save(graph_model, path)


def quantize_graphs(out_dir: str, quantization: str) -> None:
    """``int8``: int8 products. 7-bit weights (``reduce_range``) because a CPU without VNNI sums
    pairs of u8 x s8 products in 16 bits, which 8-bit weights can overflow; the folder may run on
    such a CPU. A product by a vector (RNNsearch's ``v_a``) stays float32: rounding its whole input
    to 8 bits cost more than the int8 product saved (12% of the decoding). ``int8-weights``:
    weight-only, float32 products (asymmetric blocks of 16 kept the tiny models' hypotheses best,
    docs/ONNX.md)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    for name in ("encoder.onnx", "decoder_step.onnx"):
        path = os.path.join(out_dir, name)
        if quantization == "int8":
            graph = onnx.load(path).graph
            vectors = {w.name for w in graph.initializer if list(w.dims[1:]) == [1]}
            quantize_dynamic(path, path, op_types_to_quantize=["MatMul"], per_channel=False, reduce_range=True,
                             weight_type=QuantType.QInt8, nodes_to_exclude=[
                                 n.name for n in graph.node if n.op_type == "MatMul" and n.input[1] in vectors])
        else:
            quantizer = MatMulNBitsQuantizer(onnx.load(path), bits=8, block_size=16, is_symmetric=False)
            quantizer.process()
            quantizer.model.save_model_to_file(path)


def rewrite_graphs(out_dir: str, quantization: Optional[str]) -> None:
    """The exported ``encoder.onnx`` and ``decoder_step.onnx`` rewritten for speed, and quantized."""
    if quantization == "int8-weights":  # before the rewrites: RNNsearch's v_a stays a float32 vector
        quantize_graphs(out_dir, quantization)
    for name in ("encoder.onnx", "decoder_step.onnx"):
        transposed_weights(os.path.join(out_dir, name))
        matrix_vector_products_as_matrix_products(os.path.join(out_dir, name))
        transposes_of_the_last_axes(os.path.join(out_dir, name))
    if quantization == "int8":  # after them: they find MatMuls, which int8 would have replaced (25% slower)
        quantize_graphs(out_dir, quantization)


def _write_json(path: str, value) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, ensure_ascii=False, indent=1)


def export(checkpoint: str, out_dir: str, data: Optional[str] = None, force: bool = False,
           quantize: Optional[str] = None, bpe_codes: Optional[str] = None,
           sentencepiece_model: Optional[str] = None, beam: int = 5, lenpen: float = 1.0,
           max_len_b: int = 200) -> str:
    """Write ``out_dir``; every refusal comes before anything is written."""
    check_output(out_dir, force, "decoder_step.onnx", "fairseq-plugins-export-onnx folder")
    _check_options(bpe_codes, sentencepiece_model, quantize, beam, lenpen, max_len_b)
    state = read_checkpoint(checkpoint)
    arch, family = check_exportable(state, checkpoint)
    assets = onnx_web.assets()
    model, task = build_model(state, checkpoint, data)
    src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
    bpe = "subword_nmt" if bpe_codes else "sentencepiece" if sentencepiece_model else None
    config = {
        "format": "fairseq-plugins-onnx", "version": fairseq_plugins_onnx.VERSION, "family": family, "arch": arch,
        "special": {"bos": src_dict.bos(), "pad": src_dict.pad(), "eos": src_dict.eos(), "unk": src_dict.unk()},
        "vocabularies": {"source": "source_vocabulary.json", "target": "target_vocabulary.json"},
        "beam": beam, "lenpen": lenpen, "max_len_b": max_len_b,
        "max_target_positions": int(min(model.max_decoder_positions(), 10 ** 9)),
        "quantization": quantize,
        # as fairseq-interactive --tokenizer moses --bpe subword_nmt / --bpe sentencepiece
        "preprocessing": {"tokenizer": "moses" if bpe == "subword_nmt" else None, "bpe": bpe,
                          "bpe_codes": SUBWORD_FILES["subword_nmt"] if bpe_codes else None,
                          "sentencepiece_model": SUBWORD_FILES["sentencepiece"] if sentencepiece_model else None,
                          "source_lang": task.cfg.source_lang, "target_lang": task.cfg.target_lang},
    }
    if (src_dict.pad(), src_dict.eos(), src_dict.unk()) != (tgt_dict.pad(), tgt_dict.eos(), tgt_dict.unk()):
        raise ConfigError(f"{checkpoint}: the source and target dictionaries number <pad>, </s>, <unk> differently")
    with staged_folder(out_dir) as staging:
        config.update(write_graphs(model, staging))
        rewrite_graphs(staging, quantize)
        _write_json(os.path.join(staging, "source_vocabulary.json"), list(src_dict.symbols))
        _write_json(os.path.join(staging, "target_vocabulary.json"), list(tgt_dict.symbols))
        for path, name in ((bpe_codes, SUBWORD_FILES["subword_nmt"]),
                           (sentencepiece_model, SUBWORD_FILES["sentencepiece"])):
            if path:
                shutil.copyfile(path, os.path.join(staging, name))
        _write_json(os.path.join(staging, fairseq_plugins_onnx.CONFIG), config)
        shutil.copyfile(fairseq_plugins_onnx.__file__, os.path.join(staging, "fairseq_plugins_onnx.py"))
        onnx_web.write_page(staging, assets, os.path.join(staging, SUBWORD_FILES["sentencepiece"])
                            if sentencepiece_model else None)
    return out_dir
