"""``--compile-decoding``: linear layers prepacked for oneDNN and RNNsearch's alignment energies
compiled by torch.compile decode as the eager model does. Oracles: the eager formula on the same
tensors, and plain fairseq-generate on the same checkpoint (every hypothesis of --nbest 2, its
score and positional scores)."""
import argparse
import logging

import pytest
import torch
from fairseq import checkpoint_utils, options
from fairseq.dataclass.configs import GenerationConfig
from helpers import generate_in_process, parse_generation

from fairseq_plugins.modules.additive_attention import AdditiveAttention
from fairseq_plugins.errors import ConfigError
from fairseq_plugins.modules import decoding_linear
from fairseq_plugins.models import _decoding
from fairseq_plugins.modules.decoding_linear import PrepackedLinear


def test_compiled_energies_equal_the_eager_ones_and_serve_decoding_only():
    torch.manual_seed(0)
    attention = AdditiveAttention(query_size=6, annotation_size=8, hidden_size=5)
    for p in attention.parameters():
        torch.nn.init.normal_(p)  # large weights: a wrong formula could not hide in tanh's flat tails
    h, s = torch.randn(3, 7, 8), torch.randn(3, 4, 6)
    mask = torch.zeros(3, 7, dtype=torch.bool)
    mask[1, 5:] = True
    with torch.no_grad():
        eager = attention(s, attention.project_annotations(h), h, mask)
    calls = []
    attention.compile_energies()
    compiled = attention.compiled_energies
    attention.compiled_energies = lambda *args: calls.append(1) or compiled(*args)
    with torch.no_grad():
        got = attention(s, attention.project_annotations(h), h, mask)
    assert calls, "decoding did not use the compiled energies"
    for a, b in zip(got, eager):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    with torch.no_grad(), torch._dynamo.config.patch(error_on_recompile=True):  # one program for any sizes
        h2, s2 = torch.randn(5, 9, 8), torch.randn(5, 3, 6)
        attention(s2, attention.project_annotations(h2), h2, torch.zeros(5, 9, dtype=torch.bool))
    c, _ = attention(s, attention.project_annotations(h), h, mask)  # training: the autograd function
    c.sum().backward()
    assert len(calls) == 2 and attention.W_a.weight.grad is not None


def test_compiled_energies_are_the_float64_formula_at_saturation_and_near_zero():
    """The compiled tanh is written with exp: ±1 where exp overflows or vanishes, about x near 0,
    NaN where the input is NaN; within float32's rounding of the float64 energies elsewhere."""
    from fairseq_plugins.modules.additive_attention import alignment_energies
    torch.manual_seed(0)
    W_a_s = torch.randn(2, 3, 8) * 4
    W_a_s[0, 0] = torch.tensor([60.0, -60.0, 1e-8, -1e-8, 200.0, -200.0, 0.5, 0.0])
    U_a_h, v_a = torch.randn(2, 5, 8), torch.randn(8)
    U_a_h[0, 0] = 0.0
    with torch.no_grad():
        got = torch.compile(alignment_energies, dynamic=True)(W_a_s, U_a_h, v_a)
        expected = torch.add(W_a_s.double().unsqueeze(2), U_a_h.double().unsqueeze(1)).tanh() @ v_a.double()
        torch.testing.assert_close(got.double(), expected, rtol=1e-6, atol=2e-6)
        W_a_s[1, 2, 3] = float("nan")
        got = torch.compile(alignment_energies, dynamic=True)(W_a_s, U_a_h, v_a)
    assert got[1, 2].isnan().all() and not got[1, :2].isnan().any() and not got[0].isnan().any()


def _prepare(path, compile_decoding, quantize=None, half=False, device=None):
    models, cfg, _ = checkpoint_utils.load_model_ensemble_and_task([path])
    cfg.generation.compile_decoding, cfg.generation.quantize_decoding = compile_decoding, quantize
    if half:
        models[0].half()
    if device:
        models[0].to(device)
    models[0].prepare_for_inference_(cfg)
    return models[0]


def test_the_flag_prepacks_every_suite_model_compiles_rnnsearchs_energies_and_warns_for_others(
        generation_models, caplog):
    model = _prepare(generation_models["rnnsearch"], False)
    assert model.decoder.context.attention.compiled_energies is None
    assert not any(isinstance(m, PrepackedLinear) for m in model.modules())
    with caplog.at_level(logging.INFO):
        model = _prepare(generation_models["rnnsearch"], True)
    assert model.decoder.context.attention.compiled_energies is not None
    assert "RNNsearchModel prepacks its 13 linear layers for oneDNN; compiles the alignment model's energies" \
        in caplog.text
    for family, layers in (("vaswani_transformer", 12), ("rnnencdec", 11), ("seq2seq_lstm", 1)):
        caplog.clear()
        with caplog.at_level(logging.INFO):
            model = _prepare(generation_models[family], True)
        assert not any(type(m) is torch.nn.Linear for m in model.modules()), family
        assert f"prepacks its {layers} linear layers for oneDNN\n" in caplog.text + "\n", family
    caplog.clear()
    model = _prepare(generation_models["builtin_transformer"], True)
    assert "is not a fairseq-plugins model; it decodes as without the flag" in caplog.text
    assert not any(isinstance(m, PrepackedLinear) for m in model.modules())


def test_without_onednn_a_model_with_nothing_to_compile_says_so(generation_models, caplog, monkeypatch):
    monkeypatch.setattr(decoding_linear, "prepacking_available", lambda: False)  # an arm64 CPU, say
    model = _prepare(generation_models["rnnencdec"], True)
    assert "RNNencdecModel has nothing to prepack (not an x86 CPU, or torch without oneDNN) or compile; it " \
           "decodes as without the flag" in caplog.text
    assert not any(isinstance(m, PrepackedLinear) for m in model.modules())


@pytest.mark.slow
@pytest.mark.parametrize("family", ["rnnsearch", "vaswani_transformer", "rnnencdec", "seq2seq_lstm"])
def test_fairseq_generate_with_compiled_decoding_gives_the_same_hypotheses(family, generation_models,
                                                                         plain_generations, data_bin, tmp_path):
    plain = plain_generations[family]  # --nbest 2, beam 2
    compiled = parse_generation(generate_in_process(tmp_path, data_bin, generation_models[family],
                                                    "--nbest", "2", "--compile-decoding"))
    assert sorted(compiled) == sorted(plain)
    for i in plain:  # scores are printed with 4 decimals: rounding may differ by one in the last
        assert compiled[i]["nbest"] == plain[i]["nbest"], i
        assert float(compiled[i]["H"][0]) == pytest.approx(float(plain[i]["H"][0]), abs=2e-4), i
        got, expected = (list(map(float, entry["P"].split())) for entry in (compiled[i], plain[i]))
        assert got == pytest.approx(expected, abs=2e-4), i


def test_int8_decoding_quantizes_the_products_and_refuses_what_it_cannot_run(generation_models, caplog,
                                                                            monkeypatch):
    quantized = torch.ao.nn.quantized.dynamic.Linear
    monkeypatch.setattr(_decoding, "cpu_flags", lambda: ["avx2", "fma", "avx512f", "amx_int8"])  # a Xeon
    with caplog.at_level(logging.INFO):
        model = _prepare(generation_models["rnnsearch"], True, "int8")
    assert sum(isinstance(m, quantized) for m in model.modules()) == 12  # 13 but v_a, a vector
    assert isinstance(model.decoder.context.attention.v_a, torch.nn.Linear)  # read as a weight, left in float32
    assert model.decoder.context.attention.compiled_energies is not None
    assert "--quantize-decoding int8 --compile-decoding: RNNsearchModel quantizes its 12 linear layers to int8 (onednn " \
           "kernels); prepacks its 1 linear layers for oneDNN; compiles the alignment model's energies" in caplog.text
    caplog.clear()
    monkeypatch.setattr(_decoding, "cpu_flags", lambda: ["avx2", "fma"])  # an AVX2-only CPU
    model = _prepare(generation_models["vaswani_transformer"], False, "int8")
    assert sum(isinstance(m, quantized) for m in model.modules()) == 12
    assert f"quantizes its 12 linear layers to int8 ({torch.backends.quantized.engine} kernels)" in caplog.text
    assert caplog.text.count("--quantize-decoding int8: no int8 dot products on this CPU (none of AVX512-VNNI, "
                             "AVX-VNNI, AMX): int8 decodes about as fast as float32 here") == 1
    with pytest.raises(ConfigError, match=r"^--quantize-decoding int8: int8 decoding runs on a CPU from float32 "
                                          r"weights; add --cpu and leave out --fp16/--bf16$"):
        _prepare(generation_models["rnnsearch"], False, "int8", half=True)
    with pytest.raises(ConfigError, match=r"^--quantize-decoding int8: int8 decoding runs on a CPU"):
        _prepare(generation_models["rnnsearch"], False, "int8", device="meta")  # float32, not on the CPU


def test_both_flags_are_off_unless_given(generation_models):
    """Without them fairseq-generate decodes as fairseq does: eager, float32; so does a configuration
    that has no such options (one made before them, or by hand)."""
    assert (GenerationConfig().compile_decoding, GenerationConfig().quantize_decoding) == (False, None)
    parser = options.get_generation_parser(default_task="translation")
    args, _ = parser.parse_known_args([])
    assert (args.compile_decoding, args.quantize_decoding) == (False, None)
    args, _ = parser.parse_known_args(["--compile-decoding", "--quantize-decoding", "int8"])
    assert (args.compile_decoding, args.quantize_decoding) == (True, "int8")
    models, _, _ = checkpoint_utils.load_model_ensemble_and_task([generation_models["rnnsearch"]])
    models[0].prepare_for_inference_(argparse.Namespace(generation=argparse.Namespace()))
    assert not any(isinstance(m, PrepackedLinear) for m in models[0].modules())
    assert models[0].decoder.context.attention.compiled_energies is None


@pytest.mark.slow
@pytest.mark.parametrize("family", ["rnnsearch", "vaswani_transformer"])
def test_fairseq_generate_int8_decoding_keeps_most_hypotheses(family, generation_models, plain_generations,
                                                               data_bin, tmp_path):
    """The flag reaches fairseq-generate; its scores are int8's (not float32's) and near them. On these
    60-update models near-ties are everywhere: the bar on agreement is the benchmark's, on a
    converged model (docs/BENCHMARKS.md)."""
    plain = plain_generations[family]
    int8 = parse_generation(generate_in_process(tmp_path, data_bin, generation_models[family], "--nbest", "2",
                                                "--quantize-decoding", "int8"))
    assert sorted(int8) == sorted(plain)
    same = [i for i in plain if int8[i]["nbest"][0] == plain[i]["nbest"][0]]
    differences = [abs(float(int8[i]["H"][0]) - float(plain[i]["H"][0])) for i in same]
    assert len(same) >= 0.7 * len(plain)
    assert max(differences) > 2e-4 and max(differences) < 0.1
