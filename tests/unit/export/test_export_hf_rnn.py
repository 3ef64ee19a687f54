"""The transformers export of rnnsearch, rnnencdec and seq2seq_lstm (remote code shipped in the folder).

Oracles: fairseq's model on the same weights (log-probabilities, the trained tiny models and
untrained ones for the options those lack), fairseq-generate --beam 4 on 100 test sentences,
the cached step-by-step decoder against one full forward, and one batch padded on the left
(fairseq) against the same sentences padded on the right.
"""
import argparse
import json
import math
import os
import shutil
import sys

import pytest
import torch
from fairseq import checkpoint_utils, options
from fairseq.data import Dictionary, data_utils
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY
from fairseq_cli.generate import main as generate_main
from fairseq_cli.preprocess import main as preprocess_main
from safetensors.torch import load_file, save_file
from transformers import AutoModelForSeq2SeqLM

import fairseq_plugins  # noqa: F401  (registers the models)
from fairseq_plugins.errors import ConfigError
from fairseq_plugins.export.hf import export as export_hf
from fairseq_plugins.export.hf.rnn import MODELING_FILE, check_supported, write_model
from helpers import USER_DIR, assert_beam_agrees, make_corpus, run

FAMILIES = ("rnnsearch", "rnnencdec", "seq2seq_lstm")
# fairseq-generate --beam 4's search in transformers' generate (the defaults --max-len-b 200, --lenpen 1,
# --min-len 1): a sentence ends once 4 hypotheses ended with </s>; <pad> never, </s> not first, forced at the limit
FAIRSEQ_BEAM_4 = dict(num_beams=4, early_stopping=True, length_penalty=1.0, max_new_tokens=201, min_new_tokens=1,
                      forced_eos_token_id=2, suppress_tokens=[1])


def export(checkpoint, out_dir):
    """The export step of every test of a trained checkpoint: what fairseq-plugins-export-hf --beam 4 runs."""
    return export_hf(checkpoint, out_dir, beam=4)


def load(model_dir):
    return AutoModelForSeq2SeqLM.from_pretrained(model_dir, trust_remote_code=True).eval()


def fairseq_log_probs(model, src, prev):
    """fairseq's log p(y_t | y_<t, x) (B, T, V) of left-padded ``src`` and ``prev`` (starting with </s>)."""
    with torch.no_grad():
        net_output = model(src, src.ne(model.encoder.dictionary.pad()).sum(1), prev)
        return model.get_normalized_probs(net_output, log_probs=True)


def hf_log_probs(hf, src, prev, attention_mask=None):
    with torch.no_grad():
        return torch.log_softmax(hf(input_ids=src, attention_mask=attention_mask, decoder_input_ids=prev).logits, -1)


def pad_batch(rows, pad, left):
    """(B, max len) of the 1-D tensors ``rows``, padded on the left or the right."""
    out = torch.full((len(rows), max(len(r) for r in rows)), pad)
    for b, r in enumerate(rows):
        if left:
            out[b, out.size(1) - len(r):] = r
        else:
            out[b, : len(r)] = r
    return out


def close(actual, expected, where):
    assert (actual - expected).abs().max().item() <= 1e-4, f"{where}: {(actual - expected).abs().max().item()}"


@pytest.fixture(scope="module")
def exported(generation_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("hf-rnn")
    return {f: export(generation_models[f], str(root / f)) for f in FAMILIES}


@pytest.mark.parametrize("family", FAMILIES)
def test_log_probabilities_equal_fairseq_with_padding_and_step_by_step(family, generation_models, exported, data_bin):
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([generation_models[family]])
    model, src_dict, tgt_dict = models[0].eval(), task.source_dictionary, task.target_dictionary
    sources = data_utils.load_indexed_dataset(f"{data_bin}/test.src-tgt.src", src_dict)
    targets = data_utils.load_indexed_dataset(f"{data_bin}/test.src-tgt.tgt", tgt_dict)
    rows = range(8)
    src = pad_batch([sources[i].long() for i in rows], src_dict.pad(), left=True)
    tgt = pad_batch([targets[i].long() for i in rows], tgt_dict.pad(), left=False)
    prev = torch.cat([torch.full((len(rows), 1), tgt_dict.eos()), tgt[:, :-1]], 1)  # fairseq's prev_output_tokens
    assert src.eq(src_dict.pad()).any() and tgt.eq(tgt_dict.pad()).any()
    real = tgt.ne(tgt_dict.pad())  # compared where the target has a token (</s> included)
    expected = fairseq_log_probs(model, src, prev)[real]

    hf = load(exported[family])
    close(hf_log_probs(hf, src, prev)[real], expected, "left padding, no attention_mask")
    right = pad_batch([sources[i].long() for i in rows], src_dict.pad(), left=False)
    close(hf_log_probs(hf, right, prev, right.ne(src_dict.pad()).long())[real], expected, "right padding")
    with torch.no_grad():  # labels: the mean cross-entropy of the target tokens, decoder inputs shifted from them
        loss = hf(input_ids=src, labels=tgt.masked_fill(~real, -100)).loss
    close(loss, -expected.gather(1, tgt[real].unsqueeze(1)).mean(), "loss")
    if family == "rnnsearch":  # output_attentions: the alignment weights α (B, 1 head, T, S)
        with torch.no_grad():
            alpha = model(src, src.ne(src_dict.pad()).sum(1), prev)[1]["attn"][0]
            close(hf(input_ids=src, decoder_input_ids=prev, output_attentions=True).cross_attentions[0][:, 0], alpha,
                  "attention")

    # one token at a time through the cache (as generate runs it), against the full forward
    with torch.no_grad():
        encoder_outputs = hf.get_encoder()(src, src.ne(src_dict.pad()).long())
        cache, steps = None, []
        for t in range(prev.size(1)):
            out = hf(encoder_outputs=encoder_outputs, decoder_input_ids=prev[:, t:t + 1], cache=cache, use_cache=True)
            cache = out.cache
            steps.append(torch.log_softmax(out.logits, -1))
    close(torch.cat(steps, 1)[real], expected, "step by step")


DICT, SOURCE_DICT = Dictionary(), Dictionary()
for _w in range(30):
    DICT.add_symbol(f"w{_w}")
for _w in range(23):
    SOURCE_DICT.add_symbol(f"s{_w}")

# options the trained tiny models do not exercise: stacked encoders, s_{i-1} in the deep output, no
# reversal, 3 LSTM layers, source and target dictionaries of different sizes
VARIANTS = {
    "rnnsearch-previous-2-layers": ("rnnsearch_tiny", dict(deep_output_state="previous", encoder_layers=2)),
    "rnnsearch-own-sizes": ("rnnsearch_tiny", dict(encoder_hidden_size=24, decoder_hidden_size=40,
                                                   attention_hidden_size=16, maxout_dim=12, decoder_embed_dim=20)),
    "rnnencdec-previous-2-layers": ("rnnencdec_tiny", dict(deep_output_state="previous", encoder_layers=2)),
    "seq2seq-lstm-not-reversed": ("seq2seq_lstm_tiny", dict(reverse_source=False)),
    "seq2seq-lstm-3-layers": ("seq2seq_lstm_tiny", dict(encoder_layers=3, decoder_layers=3)),
}


def build(arch, source_dict=DICT, **overrides):
    """An untrained fairseq model, every parameter from N(0, 0.3²) so that no term is near zero."""
    args = argparse.Namespace(arch=arch, **overrides)
    ARCH_CONFIG_REGISTRY[arch](args)
    task = argparse.Namespace(source_dictionary=source_dict, target_dictionary=DICT)
    torch.manual_seed(0)
    model = ARCH_MODEL_REGISTRY[arch].build_model(args, task)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model.eval()


def random_rows(lengths, vocab, eos, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.cat([torch.randint(4, vocab, (n - 1,), generator=g), torch.tensor([eos])]) for n in lengths]


@pytest.mark.parametrize("variant", VARIANTS)
def test_options_compute_fairseq_function(variant, tmp_path):
    arch, overrides = VARIANTS[variant]
    model = build(arch, source_dict=SOURCE_DICT, **overrides)
    write_model(model, str(tmp_path))
    hf = load(str(tmp_path))
    rows = random_rows((9, 3, 6, 12), len(SOURCE_DICT), SOURCE_DICT.eos(), seed=1)
    src = pad_batch(rows, SOURCE_DICT.pad(), left=True)
    prev = torch.cat([torch.full((4, 1), DICT.eos()),
                      torch.randint(4, len(DICT), (4, 7), generator=torch.Generator().manual_seed(2))], 1)
    expected = fairseq_log_probs(model, src, prev)
    close(hf_log_probs(hf, src, prev), expected, variant)
    right = pad_batch(rows, SOURCE_DICT.pad(), left=False)
    close(hf_log_probs(hf, right, prev, right.ne(SOURCE_DICT.pad()).long()), expected, variant + ", right padding")


def fairseq_generate(data, checkpoint, results):
    """{id: (score in bits, hypothesis)} of fairseq-generate --beam 4 with its other defaults (its
    main, run in this process to spare three interpreter starts)."""
    args = options.parse_args_and_arch(options.get_generation_parser(), [
        data, "--user-dir", USER_DIR, "--path", checkpoint, "--beam", "4", "--cpu", "--batch-size", "50",
        "--results-path", results])
    generate_main(args)
    hyps = {}
    with open(os.path.join(results, "generate-test.txt"), encoding="utf-8") as f:
        for line in f:
            if line.startswith("H-"):
                key, score, text = line.rstrip("\n").split("\t")
                hyps[int(key[2:])] = (float(score), text)
    return hyps


@pytest.fixture(scope="module")
def beam_oracle(generation_models, data_bin, tmp_path_factory):
    """100 test sentences binarized with data_bin's dictionaries (the first 30 are data_bin's test
    set: each split has its own seeded stream) and {family: fairseq_generate output}."""
    root = tmp_path_factory.mktemp("hf-rnn-100")
    raw = make_corpus(str(root / "raw"), train=1, valid=0, test=100)
    data = str(root / "bin")
    preprocess_main(options.get_preprocessing_parser().parse_args([
        "--source-lang", "src", "--target-lang", "tgt", "--testpref", f"{raw}/test", "--destdir", data,
        "--srcdict", f"{data_bin}/dict.src.txt", "--tgtdict", f"{data_bin}/dict.tgt.txt", "--workers", "1"]))
    return data, {f: fairseq_generate(data, generation_models[f], str(root / f)) for f in FAMILIES}


def hf_hypotheses(model_dir, data, **settings):
    """[(hypothesis, score in bits)] of ``generate(**settings)`` on ``data``'s 100 test sources."""
    src_dict, tgt_dict = Dictionary.load(f"{data}/dict.src.txt"), Dictionary.load(f"{data}/dict.tgt.txt")
    sources = data_utils.load_indexed_dataset(f"{data}/test.src-tgt.src", src_dict)
    hf, found = load(model_dir), []
    for start in range(0, len(sources), 50):  # padded on the right, as a transformers tokenizer does
        src = pad_batch([sources[i].long() for i in range(start, min(start + 50, len(sources)))], src_dict.pad(),
                        left=False)
        with torch.no_grad():
            out = hf.generate(src, attention_mask=src.ne(src_dict.pad()).long(), output_scores=True,
                              return_dict_in_generate=True, **settings)
        for sequence, score in zip(out.sequences, out.sequences_scores):
            tokens = sequence[1:].tolist()  # after decoder_start (</s>)
            found.append((tgt_dict.string(torch.tensor(tokens[: tokens.index(tgt_dict.eos())])),
                          score.item() / math.log(2)))
    return found


@pytest.mark.parametrize("family", FAMILIES)
def test_beam_search_gives_the_hypotheses_of_fairseq_generate(family, exported, beam_oracle):
    data, hypotheses = beam_oracle
    found = hf_hypotheses(exported[family], data, **FAIRSEQ_BEAM_4)
    assert len(found) == len(hypotheses[family]) == 100
    # fairseq prints log2-probability / length; 100/100 equal when measured
    expected = {i: (text, score) for i, (score, text) in hypotheses[family].items()}
    assert assert_beam_agrees(dict(enumerate(found)), expected, max_len=200) == []


def test_transformers_default_stopping_is_not_fairseqs(exported, beam_oracle):
    """early_stopping=False (transformers' default) goes on while a running beam could still beat
    the finished ones: other hypotheses than fairseq's (73/100 on this model when measured)."""
    data, hypotheses = beam_oracle
    found = hf_hypotheses(exported["seq2seq_lstm"], data, **{**FAIRSEQ_BEAM_4, "early_stopping": False})
    same = sum(text == hypotheses["seq2seq_lstm"][i][1] for i, (text, _) in enumerate(found))
    print(f"seq2seq_lstm, early_stopping=False: {same}/100 equal to fairseq-generate --beam 4")
    assert same < 100


def test_missing_or_unexpected_weight_fails_loading(exported, tmp_path):
    for change in ("missing", "unexpected"):
        folder = shutil.copytree(exported["rnnsearch"], str(tmp_path / change))
        weights = load_file(os.path.join(folder, "model.safetensors"))
        if change == "missing":
            del weights["decoder.context.attention.v_a.weight"]
        else:
            weights["decoder.extra.weight"] = torch.zeros(2)
        save_file(weights, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
        name = "v_a.weight" if change == "missing" else "decoder.extra.weight"
        with pytest.raises(ValueError, match=f"{change}_keys.*{name}"):
            load(folder)


# run with fairseq and the suite unimportable: the shipped code needs torch and transformers only
WITHOUT_FAIRSEQ = """
import json, sys
sys.modules["fairseq"] = sys.modules["fairseq_plugins"] = None
import torch
from transformers import AutoModelForSeq2SeqLM
model = AutoModelForSeq2SeqLM.from_pretrained(sys.argv[1], trust_remote_code=True).eval()
src = torch.tensor(json.loads(sys.argv[2]))
print(json.dumps(model.generate(src, num_beams=4, max_new_tokens=20).tolist()))
"""


def test_save_pretrained_round_trip_and_a_moved_folder_loads_without_fairseq(exported, tmp_path):
    hf = load(exported["seq2seq_lstm"])
    saved = str(tmp_path / "saved")
    hf.save_pretrained(saved)
    assert os.path.isfile(os.path.join(saved, MODELING_FILE))
    again = load(saved)
    for (name, a), (_, b) in zip(hf.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), name
    moved = shutil.move(saved, str(tmp_path / "elsewhere" / "model"))
    src = pad_batch(random_rows((6, 9), 40, 2, seed=3), 1, left=False)
    with torch.no_grad():
        expected = hf.generate(src, num_beams=4, max_new_tokens=20).tolist()
    out = run([sys.executable, "-c", WITHOUT_FAIRSEQ, moved, json.dumps(src.tolist())],
              env={"HF_HUB_OFFLINE": "1", "PYTHONPATH": ""})
    assert json.loads(out.strip().splitlines()[-1]) == expected


def test_unsupported_models_are_refused_in_one_line_before_writing(tmp_path):
    with pytest.raises(ConfigError, match="VaswaniTransformerModel is not a model of rnnsearch"):
        check_supported(build("vaswani_transformer_tiny"))
    model = build("rnnsearch_tiny")
    model.decoder.extra = torch.nn.Linear(2, 2)  # a parameter the exported model would not have
    with pytest.raises(ConfigError, match=r"^rnnsearch parameter decoder\.extra\.bias: \(2,\) in the checkpoint, "
                                          r"absent in the exported model; not exported$"):
        write_model(model, str(tmp_path))
    assert os.listdir(tmp_path) == []


def test_pipeline_on_raw_text_gives_the_suite_route_strings(generation_models, beam_oracle, tmp_path):
    """pipeline("translation") on raw text == tokenize -> fairseq-generate --beam 4 -> detokenize."""
    from transformers import pipeline

    from fairseq_plugins.cli.tokenize import main as tokenize_main
    from fairseq_plugins.export.hf import export as export_folder

    data, hypotheses = beam_oracle
    raw = os.path.join(os.path.dirname(data), "raw", "test.src")
    tokenize_main(["tokenize", "-l", "src", "-i", raw, "-o", str(tmp_path / "tok")])
    with open(raw, encoding="utf-8") as f, open(tmp_path / "tok", encoding="utf-8") as g:
        lines = f.read().splitlines()[:20]
        assert g.read().splitlines()[:20] == lines  # so fairseq-generate read the tokenized text
    for family in FAMILIES:
        hyp, detok = tmp_path / f"{family}.hyp", tmp_path / f"{family}.detok"
        hyp.write_text("".join(hypotheses[family][i][1] + "\n" for i in range(20)), encoding="utf-8")
        tokenize_main(["detokenize", "-l", "tgt", "-i", str(hyp), "-o", str(detok)])
        model_dir = export_folder(generation_models[family], str(tmp_path / family), beam=4)
        translate = pipeline("translation", model=model_dir, trust_remote_code=True)  # docs/DEPLOYMENT.md's lines
        assert [r["translation_text"] for r in translate(lines)] == detok.read_text(encoding="utf-8").splitlines()


def test_the_shipped_layers_equal_fairseq_plugins_modules_on_random_weights():
    """fairseq_rnn_layers.py (shipped in the folder, torch alone) against the originals it copies:
    the papers' GRU (both directions, padding on either side; the training loop and the
    generation scan), the additive attention, the conditional GRU cell, the source reversal."""
    from fairseq_plugins.export.hf import fairseq_rnn_layers as shipped
    from fairseq_plugins.models.seq2seq_lstm import reverse_source_tokens
    from fairseq_plugins.modules.additive_attention import AdditiveAttention
    from fairseq_plugins.modules.conditional_gru import ConditionalGRUCell
    from fairseq_plugins.modules.gru import GRU

    def same_weights(copy, original):
        for p in original.parameters():
            torch.nn.init.normal_(p, std=0.5)
        copy.load_state_dict(original.state_dict())  # the same names, or this fails
        return copy, original

    g = torch.Generator().manual_seed(7)
    padding = torch.zeros(4, 9, dtype=torch.bool)
    padding[0, :3] = padding[1, 6:] = True  # left, right, none
    for directions in (1, 2):
        copy, original = same_weights(shipped.PaperGRU(5, 6, directions), GRU(5, 6, bidirectional=directions == 2))
        x = torch.randn(4, 9, 5, generator=g)
        for grad in (True, False):  # the loop (training) and the scan (generation)
            with torch.set_grad_enabled(grad):
                for got, expected in zip(copy(x, padding), original(x, padding)):
                    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    copy, original = same_weights(shipped.AdditiveAttention(6, 10, 7), AdditiveAttention(6, 10, 7))
    s, h = torch.randn(4, 6, generator=g), torch.randn(4, 9, 10, generator=g)
    with torch.no_grad():
        for got, expected in zip(copy(s, copy.U_a(h), h, padding), original(s, original.U_a(h), h, padding)):
            torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    copy, original = same_weights(shipped.ConditionalGRUCell(5, 6, 10), ConditionalGRUCell(5, 6, 10))
    W_Ey, C_c, s = torch.randn(4, 18, generator=g), torch.randn(4, 18, generator=g), torch.randn(4, 6, generator=g)
    with torch.no_grad():
        torch.testing.assert_close(copy(W_Ey, C_c, s), original(W_Ey, C_c, s), rtol=1e-6, atol=1e-6)
    tokens = torch.randint(4, 30, (4, 9), generator=g).masked_fill(padding, 1)
    tokens[0, -1] = tokens[1, 5] = tokens[2, -1] = 2  # </s> ends a sentence (the last has none)
    words = tokens.ne(1) & tokens.ne(2)
    assert torch.equal(shipped.reverse_words(tokens, words), reverse_source_tokens(tokens, pad=1, eos=2))
