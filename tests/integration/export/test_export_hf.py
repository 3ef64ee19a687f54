"""fairseq-plugins-export-hf, vaswani_transformer: transformers computes what fairseq computes.

Oracles, on tiny trained models: fairseq's own forward (log-probabilities within 1e-4 for each
exported layout: MarianMT with the permuted model dimension, FSMT for --fairseq-positions,
shared / tied / separate embeddings), fairseq-generate --beam 4 (the same hypotheses from the
same token ids), and the suite's text route (fairseq-plugins-tokenize, subword-nmt or
sentencepiece, fairseq-preprocess, fairseq-generate --remove-bpe, detokenize) against
``pipeline("translation")`` on raw text.
"""
import math
import os
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline

from fairseq_plugins.cli import export_hf
from fairseq_plugins.cli import tokenize as tokenize_cli
from fairseq_plugins.data.subwords import learn_apply_bpe, learn_apply_sentencepiece, write_lines
from fairseq_plugins.data.synthetic_corpus import preprocess_args
from fairseq_plugins.errors import CheckpointError
from fairseq_plugins.export.hf import export as export_in_process
from fairseq_plugins.export.hf import load_model, load_strict
from helpers import BIN, ONE_THREAD, USER_DIR, assert_beam_agrees, in_parallel, make_corpus, preprocess, run, train

pytestmark = pytest.mark.slow

EXPORT = "fairseq-plugins-export-hf"
TINY = ["--arch", "vaswani_transformer_tiny", "--encoder-layers", "1", "--decoder-layers", "1",
        "--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--no-epoch-checkpoints"]
LAYOUTS = {  # name: (data, checkpoint trained with, --fairseq-positions, transformers class)
    "share-all": ("joined", "share-all", False, "MarianMTModel"),
    "separate-tied-output": ("separate", "separate-tied-output", False, "MarianMTModel"),
    # the same weights: --fairseq-positions only changes a table that is not stored
    "fairseq-positions-share-all": ("joined", "share-all", True, "FSMTForConditionalGeneration"),
    "fairseq-positions-separate": ("separate", "separate-tied-output", True, "FSMTForConditionalGeneration"),
    "fairseq-positions-untied": ("joined", "plain", True, "FSMTForConditionalGeneration"),
}
# raw text with what the Moses steps change: case, punctuation, an apostrophe, a hyphen
EXTRA_RAW = ["The ka, to mi!", "sen-dol (pa) \"vik\" ne's sho.", "bar & lu ... tek?"]


def export(*args):
    """The console script pip installed, as a user runs it."""
    command = os.path.join(BIN, EXPORT)
    assert os.path.isfile(command), f"{command} is not installed: pip install -e . (scripts/setup_env.sh does)"
    return run([command, *args])


def refused(args, fragment, capsys):
    """The command's main() in-process: exit 2 with one line ``prog: error: ...`` naming ``fragment``."""
    with pytest.raises(SystemExit) as exit_info:
        export_hf.main([str(a) for a in args])
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and lines[-1].startswith(f"{EXPORT}: error:") and fragment in lines[-1], lines


@pytest.fixture(scope="module")
def corpora(tmp_path_factory, data_bin, data_bin_separate):
    """100 test sentences binarized with the fixtures' dictionaries; BPE and sentencepiece copies of
    the corpus (raw text, codes / model, data-bin)."""
    root = tmp_path_factory.mktemp("hf-corpora")
    raw = make_corpus(str(root / "raw"), test=100)
    test100 = str(root / "test100")
    run(["fairseq-preprocess", *preprocess_args(raw, test100, srcdict=f"{data_bin}/dict.src.txt")])
    lines = {f"{split}.{side}": open(f"{raw}/{split}.{side}", encoding="utf-8").read().splitlines()
             for split in ("train", "valid", "test") for side in ("src", "tgt")}
    train_text = lines["train.src"] + lines["train.tgt"]
    out = {"raw": raw, "test100": test100, "joined": data_bin, "separate": data_bin_separate}
    for kind, apply in (("bpe", lambda: learn_apply_bpe(train_text, lines, 150, str(root / "bpe.codes"))),
                        ("spm", lambda: learn_apply_sentencepiece(train_text, lines, 120, str(root / "spm")))):
        os.makedirs(root / kind)
        for name, text in apply().items():
            write_lines(str(root / kind / name), text)
        out[kind] = preprocess(str(root / kind), str(root / f"{kind}-bin"))
    out["bpe.codes"], out["spm.model"] = str(root / "bpe.codes"), str(root / "spm.model")
    return out


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, corpora, generation_models):
    """{name: checkpoint}: two layouts (2 updates: log-probabilities need no training), the BPE and
    sentencepiece models (30 updates), trained with 1 thread, two at a time; the variants of LAYOUTS
    and a pre-LN checkpoint are option edits of those."""
    root = tmp_path_factory.mktemp("hf-models")
    jobs = {"share-all": (corpora["joined"], 2, ["--share-all-embeddings"]),
            "separate-tied-output": (corpora["separate"], 2, ["--share-decoder-input-output-embed"]),
            "bpe": (corpora["bpe"], 30, ["--dropout", "0.1"]), "spm": (corpora["spm"], 30, ["--dropout", "0.1"])}
    in_parallel([lambda name=name, job=job: train(job[0], root / name, TINY + job[2], job[1], env=ONE_THREAD)
                 for name, job in jobs.items()])
    paths = {name: str(root / name / "checkpoint_last.pt") for name in jobs}
    paths["plain"] = generation_models["vaswani_transformer"]  # nothing shared
    for name, (_, trained, fairseq_positions, _) in LAYOUTS.items():
        if fairseq_positions:
            paths[name] = _edited(paths[trained], root / f"{name}.pt", fairseq_positions=True)
    # pre-LN decoder: a final LayerNorm more (identity-initialised, as nn.LayerNorm)
    d = 32
    paths["pre-ln"] = _edited(paths["share-all"], root / "pre-ln.pt", decoder_normalize_before=True,
                              weights={"decoder.layer_norm.weight": torch.ones(d), "decoder.layer_norm.bias": torch.zeros(d)})
    return paths


def _edited(checkpoint, path, weights=None, **options):
    """A copy of ``checkpoint`` with model ``options`` changed and ``weights`` added."""
    state = torch.load(checkpoint, weights_only=False)
    for key, value in options.items():
        setattr(state["cfg"]["model"], key, value)
    state["model"].update(weights or {})
    torch.save(state, path)
    return str(path)


@pytest.fixture(scope="module")
def plain(generation_models, tmp_path_factory):
    """The session's vaswani_transformer (60 updates, dropout 0.3) exported with --beam 4."""
    out = tmp_path_factory.mktemp("hf-plain") / "model"
    export(generation_models["vaswani_transformer"], out, "--beam", "4", "--source-lang", "en", "--target-lang", "fr")
    return generation_models["vaswani_transformer"], str(out)


def _batch(dataset, ids, pad, left):
    """[B, S] of the sources ``ids`` of a fairseq dataset, padded left (fairseq) or right (transformers)."""
    rows = [dataset[i]["source"] for i in ids]
    out = torch.full((len(rows), max(len(r) for r in rows)), pad)
    for n, r in enumerate(rows):
        if left:
            out[n, out.size(1) - len(r):] = r
        else:
            out[n, :len(r)] = r
    return out


def _log_probs_agree(checkpoint, model_dir, data):
    _, model, task = load_model(checkpoint, data)
    hf = load_strict(model_dir)
    task.load_dataset("valid")
    dataset = task.dataset("valid")
    ids = list(range(8))
    pad, eos = task.source_dictionary.pad(), task.target_dictionary.eos()
    src_left, src_right = _batch(dataset, ids, pad, True), _batch(dataset, ids, pad, False)
    targets = [dataset[i]["target"] for i in ids]
    prev = torch.full((len(ids), max(len(t) for t in targets)), task.target_dictionary.pad())
    for n, t in enumerate(targets):
        prev[n, :len(t)] = torch.cat([torch.tensor([eos]), t[:-1]])  # fairseq's shifted targets: </s> first
    with torch.no_grad():
        expected = model.get_normalized_probs(model(src_left, src_left.ne(pad).sum(1), prev), log_probs=True)
        # use_cache=False: FSMT builds its causal mask only then
        got = hf(input_ids=src_right, attention_mask=src_right.ne(pad).long(), decoder_input_ids=prev,
                 use_cache=False).logits.log_softmax(-1)
    real = prev.ne(task.target_dictionary.pad())
    assert (got - expected)[real].abs().max() < 1e-4
    return hf


@pytest.mark.parametrize("layout", LAYOUTS)
def test_log_probs_equal_fairseq_for_each_layout(layout, checkpoints, corpora, tmp_path):
    data, trained, _, cls = LAYOUTS[layout]
    export_in_process(checkpoints[layout], str(tmp_path / "model"))
    hf = _log_probs_agree(checkpoints[layout], tmp_path / "model", corpora[data])
    assert type(hf).__name__ == cls
    # (FSMT's get_output_embeddings() is the decoder's input embedding: read the projection itself)
    output = hf.lm_head.weight if cls == "MarianMTModel" else hf.model.decoder.output_projection.weight
    decoder_in, encoder_in = hf.get_decoder().embed_tokens.weight, hf.get_encoder().embed_tokens.weight
    if trained == "share-all":  # one tensor in fairseq, one in transformers
        assert output.data_ptr() == decoder_in.data_ptr() == encoder_in.data_ptr()
    elif trained == "plain":
        assert len({output.data_ptr(), decoder_in.data_ptr(), encoder_in.data_ptr()}) == 3
    elif cls == "MarianMTModel":  # --share-decoder-input-output-embed, separate dictionaries
        assert output.data_ptr() == decoder_in.data_ptr() and encoder_in.size(0) != decoder_in.size(0)
    else:  # FSMT ties all three or none: two equal copies
        assert torch.equal(output, decoder_in) and output.data_ptr() != decoder_in.data_ptr()


def test_plain_model_log_probs_equal_fairseq(plain, data_bin):
    _log_probs_agree(*plain, data_bin)


def test_generate_beam_4_gives_fairseq_generate_hypotheses_from_the_same_ids(plain, corpora):
    checkpoint, model_dir = plain
    out = run(["fairseq-generate", corpora["test100"], "--user-dir", USER_DIR, "--path", checkpoint, "--beam", "4",
               "--batch-size", "50", "--cpu", "--num-workers", "0"])
    # fairseq prints log2-probability / length
    expected = {int(i): (hyp, float(score)) for i, score, hyp in re.findall(r"^H-(\d+)\t(\S+)\t(.*)$", out, re.M)}
    _, model, task = load_model(checkpoint, corpora["test100"])
    task.load_dataset("test")
    dataset, d = task.dataset("test"), task.target_dictionary
    assert len(dataset) == 100
    hf = load_strict(model_dir)
    assert hf.generation_config.num_beams == 4 and hf.generation_config.early_stopping is True
    found = {}
    for start in range(0, 100, 25):
        ids = list(range(start, start + 25))
        src = _batch(dataset, ids, d.pad(), left=False)
        with torch.no_grad():  # the folder's generation config
            output = hf.generate(input_ids=src, attention_mask=src.ne(d.pad()).long(), output_scores=True,
                                 return_dict_in_generate=True)
        for i, row, score in zip(ids, output.sequences.tolist(), output.sequences_scores.tolist()):
            found[i] = (d.string(torch.tensor(row), extra_symbols_to_ignore={d.pad()}), score / math.log(2))
    # 100/100 equal when measured
    assert assert_beam_agrees(found, expected, max_len=min(200, model.decoder.max_positions() - 1)) == []


def _suite_route(tmp, data, checkpoint, raw_lines, bpe_codes=None, spm_model=None):
    """raw text -> fairseq-plugins-tokenize [+ subword-nmt] or spm-encode -> fairseq-preprocess ->
    fairseq-generate --beam 4 --remove-bpe -> fairseq-plugins-tokenize detokenize."""
    os.makedirs(tmp)
    write_lines(f"{tmp}/raw", raw_lines)
    # fairseq-plugins-tokenize's main() in-process: the same code as the command, without a process start
    if spm_model:
        tokenize_cli.main(["spm-encode", "--model", spm_model, "-i", f"{tmp}/raw", "-o", f"{tmp}/test.src"])
    else:
        tokenize_cli.main(["tokenize", "-l", "en", "-i", f"{tmp}/raw", "-o", f"{tmp}/tok"])
        if bpe_codes:
            run(["subword-nmt", "apply-bpe", "-c", bpe_codes, "--input", f"{tmp}/tok", "--output", f"{tmp}/test.src"])
        else:
            shutil.copy(f"{tmp}/tok", f"{tmp}/test.src")
    shutil.copy(f"{tmp}/test.src", f"{tmp}/test.tgt")  # fairseq-generate wants references: unused
    run(["fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", "--testpref", f"{tmp}/test",
         "--srcdict", f"{data}/dict.src.txt", "--tgtdict", f"{data}/dict.tgt.txt", "--destdir", f"{tmp}/bin",
         "--workers", "1"])
    out = run(["fairseq-generate", f"{tmp}/bin", "--user-dir", USER_DIR, "--path", checkpoint, "--beam", "4",
               "--batch-size", "16", "--cpu", "--num-workers", "0",
               "--remove-bpe", "sentencepiece" if spm_model else "@@ "])
    hyps = dict(re.findall(r"^H-(\d+)\t\S+\t(.*)$", out, re.M))
    write_lines(f"{tmp}/hyp", [hyps[str(i)] for i in range(len(raw_lines))])
    if spm_model:
        return [hyps[str(i)] for i in range(len(raw_lines))]
    tokenize_cli.main(["detokenize", "-l", "fr", "-i", f"{tmp}/hyp", "-o", f"{tmp}/detok"])
    return open(f"{tmp}/detok", encoding="utf-8").read().splitlines()


def _raw_lines(corpora):
    return open(f"{corpora['raw']}/test.src", encoding="utf-8").read().splitlines()[:30] + EXTRA_RAW


def _pipeline_strings(model_dir, lines):
    translate = pipeline("translation", model=str(model_dir), trust_remote_code=True)  # docs/DEPLOYMENT.md's lines
    return [r["translation_text"] for r in translate(lines)]


def test_pipeline_on_raw_text_gives_the_suite_route_strings(plain, corpora, data_bin, tmp_path):
    checkpoint, model_dir = plain
    lines = _raw_lines(corpora)
    expected = _suite_route(tmp_path / "route", data_bin, checkpoint, lines)
    assert _pipeline_strings(model_dir, lines) == expected
    assert translate_one(model_dir, lines[0]) == [{"translation_text": expected[0]}]


def translate_one(model_dir, text):
    return pipeline("translation", model=str(model_dir), trust_remote_code=True)(text)


@pytest.mark.parametrize("subword", ["bpe", "spm"])
def test_pipeline_with_subwords_gives_the_suite_route_strings(subword, checkpoints, corpora, tmp_path):
    flags = ["--bpe-codes", corpora["bpe.codes"]] if subword == "bpe" else ["--sentencepiece-model", corpora["spm.model"]]
    export_in_process(checkpoints[subword], str(tmp_path / "model"), beam=4, source_lang="en", target_lang="fr",
                      **{flags[0][2:].replace("-", "_"): flags[1]})
    lines = _raw_lines(corpora)
    expected = _suite_route(tmp_path / "route", corpora[subword], checkpoints[subword], lines,
                            bpe_codes=corpora["bpe.codes"] if subword == "bpe" else None,
                            spm_model=corpora["spm.model"] if subword == "spm" else None)
    assert _pipeline_strings(tmp_path / "model", lines) == expected
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path / "model"), trust_remote_code=True)
    split = tokenizer.tokenize(" ".join(lines[:5]))
    assert any(t.endswith("@@") for t in split) if subword == "bpe" else any(t.startswith("\u2581") for t in split)


def test_same_ids_same_tokens(plain, corpora, data_bin):
    checkpoint, model_dir = plain
    _, _, task = load_model(checkpoint, data_bin)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=True)
    line = _raw_lines(corpora)[0] + " unseenword"
    assert tokenizer(line)["input_ids"] == task.source_dictionary.encode_line(line, add_if_not_exist=False).tolist()
    assert tokenizer.get_vocab() == {s: i for i, s in enumerate(task.source_dictionary.symbols)}
    assert tokenizer.convert_ids_to_tokens(list(range(len(task.target_dictionary)))) == task.target_dictionary.symbols


def test_a_missing_weight_fails_loading(plain, tmp_path):
    _, model_dir = plain
    broken = tmp_path / "broken"
    shutil.copytree(model_dir, broken)
    weights = load_file(broken / "model.safetensors")
    del weights["model.decoder.layers.0.fc1.weight"]
    save_file(weights, broken / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"missing keys model\.decoder\.layers\.0\.fc1\.weight"):
        load_strict(str(broken))


def test_save_pretrained_round_trip_and_a_moved_folder(plain, tmp_path):
    _, model_dir = plain
    moved = tmp_path / "elsewhere" / "model"
    shutil.copytree(model_dir, moved)
    hf = AutoModelForSeq2SeqLM.from_pretrained(moved).eval()
    tokenizer = AutoTokenizer.from_pretrained(moved, trust_remote_code=True)
    hf.save_pretrained(tmp_path / "saved")
    tokenizer.save_pretrained(tmp_path / "saved")
    again = load_strict(str(tmp_path / "saved"))
    batch = tokenizer(["ka to mi", "sen dol pa vik ne"], return_tensors="pt", padding=True)
    with torch.no_grad():
        assert torch.equal(hf.generate(**batch), again.generate(**batch))
    retokenized = AutoTokenizer.from_pretrained(tmp_path / "saved", trust_remote_code=True)
    assert retokenized("ka to mi")["input_ids"] == tokenizer("ka to mi")["input_ids"]


def test_bad_input_is_refused_by_name_and_nothing_is_written(plain, generation_models, checkpoints, data_bin_separate,
                                                             tmp_path, capsys):
    checkpoint, _ = plain
    out_dir = tmp_path / "out"
    refused([tmp_path / "missing.pt", out_dir], "missing.pt", capsys)
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    refused([tmp_path / "junk.pt", out_dir], "junk.pt", capsys)
    refused([generation_models["builtin_transformer"], out_dir], "'transformer'", capsys)  # another architecture
    refused([checkpoints["pre-ln"], out_dir], "--decoder-normalize-before", capsys)
    refused([checkpoint, out_dir, "--data", tmp_path / "nowhere"], "nowhere", capsys)
    (tmp_path / "empty").mkdir()
    refused([checkpoint, out_dir, "--data", tmp_path / "empty"], "dict.", capsys)
    refused([checkpoint, out_dir, "--data", data_bin_separate], "do not fit", capsys)
    refused([checkpoint, out_dir, "--bpe-codes", tmp_path / "codes"], "--bpe-codes", capsys)
    refused([checkpoint, out_dir, "--sentencepiece-model", tmp_path / "spm.model"], "--sentencepiece-model", capsys)
    refused([checkpoint, out_dir, "--max-len-a", "1.2"], "--max-len-a 1.2", capsys)
    assert not out_dir.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "junk.pt"]  # no staging left behind

    out_dir.mkdir()
    (out_dir / "notes.txt").write_text("mine")
    refused([checkpoint, out_dir], "--force", capsys)
    refused([checkpoint, out_dir, "--force"], "not a transformers model folder", capsys)
    assert [p.name for p in out_dir.iterdir()] == ["notes.txt"]
    (out_dir / "notes.txt").unlink()
    refused([checkpoint, out_dir], "--force", capsys)  # even an empty one
    export(checkpoint, out_dir, "--force")  # the command itself, in a process of its own
    refused([checkpoint, out_dir], "--force", capsys)
    export_in_process(checkpoint, str(out_dir), force=True, beam=2)  # replaces an exported folder
    assert load_strict(str(out_dir)).generation_config.num_beams == 2


def _rebuilt(checkpoint, path, **options):
    """``checkpoint`` with model ``options`` changed and fresh weights of the shapes they give."""
    from fairseq import tasks
    from omegaconf import OmegaConf

    state = torch.load(checkpoint, weights_only=False)
    for key, value in options.items():
        setattr(state["cfg"]["model"], key, value)
    torch.manual_seed(0)
    state["model"] = tasks.setup_task(OmegaConf.create(state["cfg"]["task"])).build_model(state["cfg"]["model"]).state_dict()
    torch.save(state, path)
    return str(path)


@pytest.mark.parametrize("options, fragment", [
    ({"encoder_learned_pos": True}, "--encoder-learned-pos: not exported"),
    ({"decoder_learned_pos": True}, "--decoder-learned-pos: not exported"),
    ({"decoder_embed_dim": 48}, "--encoder-embed-dim 32 differs from --decoder-embed-dim 48"),
    ({"encoder_embed_dim": 33, "decoder_embed_dim": 33, "encoder_attention_heads": 3, "decoder_attention_heads": 3},
     "--encoder-embed-dim 33 is odd"),
], ids=["encoder-learned-pos", "decoder-learned-pos", "two-widths", "odd-d-model"])
def test_the_models_transformers_cannot_compute_are_refused(options, fragment, generation_models, tmp_path, capsys):
    """docs/DEPLOYMENT.md's refusals, each on a checkpoint fairseq loads (the session's separate-embedding
    model rebuilt with the option): one line naming the option, nothing written."""
    checkpoint = _rebuilt(generation_models["vaswani_transformer"], tmp_path / "model.pt", **options)
    refused([checkpoint, tmp_path / "out"], fragment, capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt"]
