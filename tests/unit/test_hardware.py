"""The CPU line the benchmarks print and the int8 note of fairseq-plugins-export-onnx --quantize."""
from fairseq_plugins.hardware import cpu_flags, describe_cpu, int8_note

EPYC_AVX2 = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 avx avx2 fma f16c\n"
EPYC_VNNI = "model name\t: AMD EPYC 9R14\nflags\t\t: avx2 fma avx512f avx512_bf16 avx512_vnni\n"
XEON_AMX = "model name\t: Intel(R) Xeon(R) Platinum 8488C\nflags\t\t: avx2 fma avx512f avx_vnni amx_bf16 amx_int8\n"


def test_the_cpu_line_names_the_model_and_the_flags_that_decide_matrix_products():
    assert describe_cpu(EPYC_AVX2).startswith("AMD EPYC (flags: avx2 fma; no int8 dot products")
    assert cpu_flags(EPYC_VNNI) == ["avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni"]
    assert describe_cpu(XEON_AMX) == ("Intel(R) Xeon(R) Platinum 8488C (flags: avx2 fma avx512f avx_vnni amx_bf16 "
                                      "amx_int8; int8 dot products: avx_vnni, amx_int8)")


def test_without_vnni_or_amx_int8_is_said_not_to_pay_in_one_line():
    note = int8_note(cpu_flags(EPYC_AVX2))
    assert "\n" not in note and "no int8 dot products" in note and "float32 stays the default" in note
    assert int8_note(cpu_flags(EPYC_VNNI)) == "int8 dot products: avx512_vnni"
    assert cpu_flags("") == [] and "no int8 dot products" in int8_note([])
