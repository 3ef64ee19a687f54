"""patches/generation.py: for each behaviour, fairseq's generation with it out and the suite's with it in."""
import pytest
import torch
from fairseq import options
from fairseq import utils as fairseq_utils
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from helpers import TINY_BUILTIN_TRANSFORMER
from omegaconf import OmegaConf, open_dict
from patching import OFFICIAL_0_12_2, out, tiny


def generation(cfg, **options_):
    gen = OmegaConf.create(OmegaConf.to_container(cfg.generation))
    with open_dict(gen):
        gen.update({"beam": 2, "max_len_b": 10, **options_})
    return gen


def hypotheses(tiny, **options_):
    cfg, task, model, sample = tiny
    generator = task.build_generator([model], generation(cfg, **options_))
    return generator, task.inference_step(generator, [model], sample)


def has_repeat(tokens, n=2):
    grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
    return len(set(grams)) < len(grams)


def test_no_repeat_ngram(tiny):
    def repeats():
        _, hypos = hypotheses(tiny, no_repeat_ngram_size=2)
        return sum(has_repeat(h[0]["tokens"].tolist()) for h in hypos)
    with out("no_repeat_ngram"):
        assert repeats() > 0  # fairseq's CPU fallback bans nothing
    assert repeats() == 0


def test_torchscript_of_fairseqs_generator_with_the_suite(tiny, data_bin):
    """As fairseq's own test_ensemble_sequence_generator: scripting compiles the patched n-gram block."""
    from fairseq.sequence_generator import SequenceGenerator
    _, task, _, sample = tiny
    args = options.parse_args_and_arch(options.get_training_parser(), [data_bin, *TINY_BUILTIN_TRANSFORMER])
    torch.manual_seed(1)
    model = task.build_model(convert_namespace_to_omegaconf(args).model).eval()
    scripted = torch.jit.script(SequenceGenerator([model], task.tgt_dict, beam_size=2, no_repeat_ngram_size=2,
                                                  max_len_b=10))
    net_input = {k: sample["net_input"][k] for k in ("src_tokens", "src_lengths")}
    for hypos in scripted({"net_input": net_input}):
        assert not has_repeat(hypos[0]["tokens"].tolist())


def test_match_source_len(tiny):
    sample = tiny[3]
    words = (sample["net_input"]["src_tokens"].ne(1) & sample["net_input"]["src_tokens"].ne(2)).sum(1).tolist()

    def lengths():
        _, hypos = hypotheses(tiny, match_source_len=True)
        return [len(h[0]["tokens"]) - 1 for h in hypos]  # without the EOS
    with out("match_source_len"):  # fairseq's main branch counts the source's EOS; 0.12.2 does not
        assert lengths() == (words if OFFICIAL_0_12_2 else [w + 1 for w in words])
    assert lengths() == words


def test_max_len_warning_counts_per_generator(tiny):
    with out("max_len_warning"):
        generator, _ = hypotheses(tiny, max_len_b=3)
        assert "length_limit_counts" not in vars(generator)
    first, hypos = hypotheses(tiny, max_len_b=3)
    second, _ = hypotheses(tiny, max_len_b=3)
    tiny[1].inference_step(second, [tiny[2]], tiny[3])
    cut = sum(len(h[0]["tokens"]) > 3 for h in hypos)
    assert cut > 0 and (first.length_limit_counts.sentences, first.length_limit_counts.at_limit) == (4, cut)
    assert (second.length_limit_counts.sentences, second.length_limit_counts.at_limit) == (8, 2 * cut)


def test_alignment_attention(tiny):
    cfg, task, model, sample = tiny

    def align():
        generator, hypos = hypotheses(tiny, print_alignment="hard")
        return hypos
    with out("alignment_attention"):
        with pytest.raises(IndexError):  # the suite's Transformer computes attention only on demand
            align()
    hypos = align()
    assert all(len(h[0]["alignment"]) > 0 for h in hypos)


def test_replace_unk(tiny):
    cfg = tiny[0]
    with out("replace_unk"):
        generator, _ = hypotheses(tiny, replace_unk="@@ ")
        assert not getattr(generator, "unk_alignment", False)
        with pytest.raises(FileNotFoundError):
            fairseq_utils.load_align_dict("@@ ")  # --replace-unk alone: fairseq opens a file named '@@ '
    model = tiny[2]
    need_attn = {name: m.need_attn for name, m in model.named_modules() if hasattr(m, "need_attn")}
    assert need_attn and not any(need_attn.values())  # prepared for inference: attention only on demand
    generator, hypos = hypotheses(tiny, replace_unk="@@ ")
    assert generator.unk_alignment and all(len(h[0]["alignment"]) > 0 for h in hypos)
    assert fairseq_utils.load_align_dict("@@ ") == {}
    # attention was on for that generation only: the next one, without --replace-unk, computes none
    assert {name: m.need_attn for name, m in model.named_modules() if hasattr(m, "need_attn")} == need_attn


def test_hub_score(tiny):
    from fairseq.hub_utils import GeneratorHubInterface
    cfg, task, model, sample = tiny
    hub = GeneratorHubInterface(cfg, task, [model])
    source = task.src_dict.string(sample["net_input"]["src_tokens"][0]).replace("<pad>", "").strip()
    with out("hub_score"):
        with pytest.raises(TypeError):
            hub.score(source)
    scored = hub.score(source, targets="the")
    assert scored["positional_scores"].shape == (2,)  # "the" and the EOS
