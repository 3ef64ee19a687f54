"""PrepackedLinear (``--compile-decoding``'s oneDNN linear layers) computes nn.Linear's x Wᵀ + b, and the
int8 layers of ``--quantize-decoding int8`` within int8's rounding of it.
Oracle: ``F.linear`` on the same tensors, and nn.Linear's gradients for training."""
import copy
import pickle
import platform

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fairseq_plugins.modules.decoding_linear import (PrepackedLinear, int8_engine, prepack_linear_layers_,
                                                      prepacking_available, quantize_linear_layers_)

pytestmark = pytest.mark.skipif(not prepacking_available(), reason="not an x86 CPU, or torch without oneDNN")


def _layer(bias=True):
    torch.manual_seed(0)
    return PrepackedLinear.sharing(nn.Linear(24, 40, bias=bias))


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(5, 24), (3, 4, 24), (0, 24), (2, 3, 4, 24)])
def test_decoding_computes_x_W_transposed_plus_b_with_the_prepacked_weight(bias, shape):
    layer = _layer(bias)
    x = torch.randn(*shape)
    with torch.no_grad():
        y = layer(x)
    assert layer._packed is not None, "the oneDNN weight was not used"
    torch.testing.assert_close(y, F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
    with torch.inference_mode():  # fairseq-generate's mode
        torch.testing.assert_close(layer(x.transpose(-1, -2).contiguous().transpose(-1, -2)),
                                   F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)


def test_a_changed_weight_is_packed_again():
    layer, x = _layer(), torch.randn(6, 24)
    with torch.no_grad():
        layer(x)
        layer.load_state_dict({"weight": torch.randn(40, 24), "bias": torch.randn(40)})  # copy_ in place
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
    optimizer = torch.optim.SGD(layer.parameters(), lr=1.0)
    layer(x).sum().backward()
    optimizer.step()
    with torch.no_grad():
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
        layer.weight = nn.Parameter(torch.randn(40, 24))  # a new tensor
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)


def test_a_new_weight_below_the_old_one_is_packed_again_and_an_unchanged_one_is_packed_once():
    layer, x = _layer(), torch.randn(6, 24)
    memory = torch.randn(2, 40, 24)
    with torch.no_grad():
        layer.weight = nn.Parameter(memory[1])
        layer(x)
        packed = layer._packed
        layer(x)
        assert layer._packed is packed  # the same weight: the copy is made once
        layer.weight = nn.Parameter(memory[0])  # a new tensor at a lower address, same version and shape
        assert (layer.weight.data_ptr(), layer.weight._version) < packed[0][:2]
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)


def test_prepacking_needs_an_x86_cpu_and_onednn(monkeypatch):
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    assert not prepacking_available()
    monkeypatch.setattr(platform, "machine", lambda: "AMD64")
    assert prepacking_available()
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    assert not prepacking_available()


def test_another_device_runs_nn_linear():
    layer = _layer().to("meta")
    with torch.no_grad():
        assert layer(torch.empty(5, 24, device="meta")).shape == (5, 40)
    assert layer._packed is None


def test_training_and_other_dtypes_run_nn_linear():
    layer, reference = _layer(), nn.Linear(24, 40)
    reference.load_state_dict(layer.state_dict())
    x = torch.randn(7, 24)
    layer(x).square().sum().backward()
    reference(x).square().sum().backward()
    assert layer._packed is None
    for ours, theirs in zip(layer.parameters(), reference.parameters()):
        torch.testing.assert_close(ours.grad, theirs.grad)
    with torch.no_grad():
        torch.testing.assert_close(layer.double()(x.double()), F.linear(x.double(), layer.weight, layer.bias))
    assert layer._packed is None


def test_prepacking_a_model_keeps_its_parameters_ties_and_copies():
    torch.manual_seed(0)
    embed = nn.Embedding(40, 24)
    model = nn.Sequential(nn.Linear(24, 24), nn.Sequential(nn.ReLU(), nn.Linear(24, 40, bias=False)))
    model[1][1].weight = embed.weight  # tied, as the Transformer's output projection and its embeddings
    keys = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(3, 24)
    expected = model(x).detach()
    assert prepack_linear_layers_(model) == 2
    assert all(type(m) is not nn.Linear for m in model.modules())
    assert model[1][1].weight is embed.weight
    assert {k: v for k, v in model.state_dict().items()}.keys() == keys.keys()
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected, rtol=1e-5, atol=1e-5)
        embed.weight.mul_(2.0)  # the tie holds through the prepacked copy
        torch.testing.assert_close(model[1][1](x), F.linear(x, embed.weight), rtol=1e-5, atol=1e-5)
        for copied in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
            torch.testing.assert_close(copied(x), model(x), rtol=1e-5, atol=1e-5)
    assert prepack_linear_layers_(model) == 0  # already done


def test_int8_layers_multiply_in_int8_within_its_rounding_and_leave_vectors_alone():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 96), nn.Tanh(), nn.Linear(96, 1), nn.Linear(1, 32, bias=False),
                          nn.Linear(32, 2))
    x = torch.randn(20, 64)
    expected = model[0](x).detach()
    assert quantize_linear_layers_(model, torch.backends.quantized.engine) == 3
    assert type(model[2]) is nn.Linear  # a one-output layer: a vector, kept
    assert all(isinstance(model[i], torch.ao.nn.quantized.dynamic.Linear) for i in (0, 3, 4))  # two outputs too
    with torch.no_grad():
        got = model[0](x)
    error = (got - expected).norm() / expected.norm()
    assert 1e-4 < error < 0.02, error  # int8's rounding: not float32's products, and close to them


def test_int8_engine_is_onednn_where_the_cpu_has_amx():
    default = torch.backends.quantized.engine
    assert int8_engine(["avx2", "fma", "avx512f", "avx512_vnni", "amx_bf16", "amx_int8"]) == "onednn"  # a Xeon
    assert int8_engine(["avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni"]) == default  # an EPYC: VNNI only
    assert int8_engine(["avx2", "fma"]) == default == torch.backends.quantized.engine


@pytest.mark.parametrize("engine, other", [("onednn", "x86"), ("x86", "onednn")])
def test_int8_layers_run_the_kernels_of_the_engine_they_were_packed_for(engine, other):
    """Oracle: torch's own quantize_dynamic under that global engine; the two engines' outputs differ in
    the last bits (measured: 2.4e-7), so a layer packed for the other engine fails the equality."""
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(64, 96)), torch.randn(20, 64)
    expected = {}
    before = torch.backends.quantized.engine
    try:
        for name in (engine, other):
            torch.backends.quantized.engine = name
            reference = quantize_dynamic(copy.deepcopy(model), {nn.Linear: per_channel_dynamic_qconfig},
                                         dtype=torch.qint8)
            torch.backends.quantized.engine = before
            with torch.no_grad():
                expected[name] = reference(x)
    finally:
        torch.backends.quantized.engine = before
    assert not torch.equal(expected[engine], expected[other])
    torch.backends.quantized.engine = other  # the global engine at call time does not decide
    try:
        assert quantize_linear_layers_(model, engine) == 1
        assert torch.backends.quantized.engine == other  # put back
        with torch.no_grad():
            assert torch.equal(model(x), expected[engine])
    finally:
        torch.backends.quantized.engine = before
