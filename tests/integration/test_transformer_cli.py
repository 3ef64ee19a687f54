"""vaswani_transformer through fairseq's command-line tools: the converter oracle against
fairseq's built-in transformer, end-to-end training/generation with alignments and Wu's
length penalty, and the errors users see."""
import json
import os
import re
from argparse import Namespace

import pytest
import torch
from fairseq import checkpoint_utils

from fairseq_plugins.cli import convert_transformer
from helpers import ONE_THREAD, USER_DIR, generate_in_process, in_parallel, pre_2019_layout, run, train

pytestmark = pytest.mark.slow

BUILTIN = ["--arch", "transformer", "--encoder-layers", "2", "--decoder-layers", "2",
           "--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
           "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
           "--share-all-embeddings", "--dropout", "0.1", "--attention-dropout", "0.1"]
PAPER_RECIPE = ["--criterion", "label_smoothed_xent", "--label-smoothing", "0.1",
                "--adam-betas", "(0.9, 0.98)", "--adam-eps", "1e-9", "--no-epoch-checkpoints"]


def generate(data, path, *flags):
    """fairseq-generate output as {id: {"H": tokens, "A": alignment}} for every sentence."""
    out = run(["fairseq-generate", data, "--user-dir", USER_DIR, "--path", path, "--beam", "4",
               "--batch-size", "16", "--cpu", "--num-workers", "0", *flags])
    result = {}
    for line in out.splitlines():
        m = re.match(r"^([HA])-(\d+)\t(.*)$", line)
        if m:
            fields = m.group(3).split("\t")
            result.setdefault(int(m.group(2)), {})[m.group(1)] = fields[-1]
    return result, out


def valid_batch(task, n=12):
    dataset = task.dataset("valid")
    return dataset.collater([dataset[i] for i in range(n)])


def test_converted_builtin_checkpoint_gives_same_log_probs_and_translations(data_bin, tmp_path):
    save_dir = str(tmp_path / "builtin")
    train(data_bin, save_dir, BUILTIN, 4, extra=PAPER_RECIPE)
    fairseq_ckpt = os.path.join(save_dir, "checkpoint_last.pt")
    converted = str(tmp_path / "converted.pt")
    out = run(["fairseq-plugins-convert-transformer", fairseq_ckpt, converted])
    assert "fairseq positions" in out

    models = {}
    for name, path in (("fairseq", fairseq_ckpt), ("ours", converted)):
        ensemble, _, task = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides={"data": data_bin})
        task.load_dataset("valid")
        models[name] = (ensemble[0].eval(), task)
    assert type(models["ours"][0]).__name__ == "VaswaniTransformerModel"
    sample = valid_batch(models["fairseq"][1])
    with torch.no_grad():
        lp = {name: model.get_normalized_probs(model(**sample["net_input"]), log_probs=True)
              for name, (model, _) in models.items()}
    real = sample["target"].ne(models["fairseq"][1].target_dictionary.pad())
    assert (lp["ours"] - lp["fairseq"])[real].abs().max() < 1e-5

    theirs, _ = generate(data_bin, fairseq_ckpt, "--print-alignment")
    ours, _ = generate(data_bin, converted, "--print-alignment")
    assert len(ours) == len(theirs) > 0
    assert ours == theirs  # same hypotheses and same alignments (last layer, averaged over heads)


def test_converter_errors_are_one_line(data_bin, tmp_path, capsys):
    existing = tmp_path / "out.pt"
    existing.write_bytes(b"keep me")
    not_a_checkpoint = tmp_path / "notes.txt"
    not_a_checkpoint.write_text("hello\n")
    stripped, lstm = tmp_path / "stripped.pt", tmp_path / "lstm.pt"
    published_checkpoint(str(stripped), data_bin)
    state = torch.load(stripped, weights_only=False)
    torch.save(dict(state, args=None), stripped)  # what fairseq's loader reads, no options in it
    state["args"].arch = "lstm"  # another family's options: the message names the file
    torch.save(state, lstm)
    for argv, message in [
        ([str(not_a_checkpoint), str(tmp_path / "a.pt")], "notes.txt: not a readable checkpoint"),
        ([str(stripped), str(tmp_path / "c.pt")], "stripped.pt: not a fairseq model checkpoint (no cfg.model)"),
        ([str(lstm), str(tmp_path / "d.pt")], "lstm.pt: architecture 'lstm' is not of fairseq's 'transformer' family"),
        ([str(tmp_path / "missing.pt"), str(tmp_path / "b.pt")], "missing.pt does not exist"),
        ([str(not_a_checkpoint), str(existing)], "out.pt exists; pass --force"),
    ]:
        with pytest.raises(SystemExit) as e:
            convert_transformer.main(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.startswith("fairseq-plugins-convert-transformer: error: ")
        assert message in err and err.count("\n") == 1
    assert existing.read_bytes() == b"keep me"  # never overwritten without --force


def test_tiny_transformer_trains_and_generates_with_alignments(data_bin, tmp_path):
    save_dir = str(tmp_path / "tiny")
    log = train(data_bin, save_dir, ["--arch", "vaswani_transformer_tiny", "--share-all-embeddings"], 6,
                extra=PAPER_RECIPE + ["--lr-scheduler", "inverse_sqrt_warmup", "--model-dim", "64",
                                      "--warmup-updates", "4", "--lr", "1"])
    assert "num_updates 6" in log
    ckpt = os.path.join(save_dir, "checkpoint_last.pt")
    state = checkpoint_utils.load_checkpoint_to_cpu(ckpt)
    assert state["cfg"]["model"].arch == "vaswani_transformer_tiny"

    hypos, out = generate(data_bin, ckpt, "--task", "translation_wu", "--wu-lenpen", "0.6",
                          "--max-len-a", "1", "--max-len-b", "50", "--print-alignment")
    sources = {int(m.group(1)): m.group(2).split() for m in re.finditer(r"^S-(\d+)\t(.*)$", out, re.M)}
    assert len(hypos) == len(sources) == 30
    for sid, h in hypos.items():
        hyp_len = len(h["H"].split()) if h["H"] else 0
        pairs = [tuple(map(int, p.split("-"))) for p in h["A"].split()]
        assert len(pairs) == hyp_len  # one source position per target word
        assert all(0 <= s <= len(sources[sid]) and 0 <= t < hyp_len for s, t in pairs)


def test_bad_input_gives_one_line_errors(data_bin, data_bin_separate, tmp_path):
    tiny = ["--arch", "vaswani_transformer_tiny"]
    proc = run(["fairseq-train", data_bin_separate, "--user-dir", USER_DIR, *tiny, "--share-all-embeddings",
                "--optimizer", "adam", "--lr", "0.001", "--max-tokens", "1000", "--cpu",
                "--save-dir", str(tmp_path / "x")], check=False)
    assert proc.returncode != 0
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("error: --share-all-embeddings needs a joined dictionary")
    assert "Traceback" not in proc.stdout

    # sentences longer than --max-source-positions: an error naming the limit in training
    # unless --skip-invalid-size-inputs-valid-test, and at generation time
    short = ["--max-source-positions", "8", "--max-target-positions", "8"]
    proc = run(["fairseq-train", data_bin, "--user-dir", USER_DIR, *tiny, *short, "--optimizer", "adam",
                "--lr", "0.001", "--max-tokens", "1000", "--cpu", "--max-update", "1",
                "--save-dir", str(tmp_path / "y")], check=False)
    assert proc.returncode != 0 and "max_positions=(8, 8)" in proc.stdout
    save_dir = str(tmp_path / "short")
    train(data_bin, save_dir, [*tiny, *short, "--skip-invalid-size-inputs-valid-test"], 1)
    proc = run(["fairseq-generate", data_bin, "--user-dir", USER_DIR, "--path",
                os.path.join(save_dir, "checkpoint_last.pt"), "--cpu", "--batch-size", "8"], check=False)
    assert proc.returncode != 0 and "max_positions=(8, 8)" in proc.stdout


def test_checkpoint_activations_train_the_same_and_generate(data_bin, tmp_path):
    """fairseq-train --checkpoint-activations for a few updates: the same logged losses and the
    same weights bit for bit as without it (dropout 0.1: the recomputation replays the masks; one
    thread in both runs, the same kernels), and fairseq-generate loads the checkpoint (the flag
    is in its cfg; decoding does not checkpoint) and translates as the plain one does."""
    losses, weights, hypotheses = {}, {}, {}

    def train_and_generate(name, extra):
        save_dir = str(tmp_path / name)
        log = run(["fairseq-train", data_bin, "--user-dir", USER_DIR, "--arch", "vaswani_transformer_tiny",
                   "--share-all-embeddings", "--dropout", "0.1", *PAPER_RECIPE, "--optimizer", "adam", "--lr", "0.002",
                   "--max-tokens", "1000", "--max-update", "4", "--cpu", "--seed", "1", "--disable-validation",
                   "--save-dir", save_dir, "--no-progress-bar", "--log-format", "json", "--log-interval", "1",
                   "--num-workers", "0", *extra], env=ONE_THREAD)
        losses[name] = [json.loads(line.split("| train_inner |", 1)[1])["loss"] for line in log.splitlines()
                        if "| train_inner |" in line]
        hypotheses[name], _ = generate(data_bin, os.path.join(save_dir, "checkpoint_last.pt"))

    in_parallel([lambda: train_and_generate("plain", []),  # the trainings use 1 thread each
                 lambda: train_and_generate("checkpointed", ["--checkpoint-activations"])])
    # Loaded here, one after the other: fairseq 0.12.2's load_checkpoint_to_cpu swaps omegaconf's
    # is_primitive_type for the call, so two threads loading at once can see the original.
    for name, extra in (("plain", False), ("checkpointed", True)):
        state = checkpoint_utils.load_checkpoint_to_cpu(str(tmp_path / name / "checkpoint_last.pt"))
        assert state["cfg"]["model"].checkpoint_activations == extra
        weights[name] = state["model"]
    assert len(losses["plain"]) == 4 and losses["checkpointed"] == losses["plain"]
    assert weights["checkpointed"].keys() == weights["plain"].keys()
    for key, value in weights["plain"].items():
        assert torch.equal(weights["checkpointed"][key], value), key
    assert len(hypotheses["plain"]) == 30 and hypotheses["checkpointed"] == hypotheses["plain"]


# ---------------------------------------------------------------- Wu et al.'s length penalty, from the command line

def hypotheses(out):
    """{sentence id: [(printed score, words, positional log2-probabilities)]} in fairseq-generate's n-best order."""
    found, last = {}, None
    for line in out.splitlines():
        key, _, rest = line.partition("\t")
        if key.startswith("H-"):
            score, words = rest.split("\t")
            last = [float(score), words]
            found.setdefault(int(key[2:]), []).append(last)
        elif key.startswith("P-"):
            last.append([float(x) for x in rest.split()])
    return found


def test_wu_lenpen_from_the_command_line_ranks_by_log_p_over_lp(generation_models, data_bin, tmp_path):
    """fairseq-generate --task translation_wu --wu-lenpen α: every printed score is log2 P(Y) / lp(|Y|)
    with that α (|Y| with the EOS), and a larger α ranks the same n-best lists differently, as the
    formula predicts, list by list. The search itself uses raw log-probabilities, so the n-best sets do not
    depend on α."""
    ranked = {}
    for alpha in (0.0, 2.0):
        out = generate_in_process(tmp_path / str(alpha), data_bin, generation_models["vaswani_transformer"],
                                  "--task", "translation_wu", "--wu-lenpen", alpha, "--nbest", "4", beam=4)
        ranked[alpha] = hypotheses(out)
        for sid, nbest in ranked[alpha].items():
            assert len(nbest) == 4
            for score, words, positional in nbest:
                assert len(positional) == len(words.split()) + 1  # the words and the EOS
                lp = ((5 + len(positional)) / 6) ** alpha  # lp(Y) = ((5 + |Y|) / 6)^α
                assert score == pytest.approx(sum(positional) / lp, abs=2e-3), (alpha, sid, words)
            assert [h[0] for h in nbest] == sorted((h[0] for h in nbest), reverse=True)
    assert ranked[0.0].keys() == ranked[2.0].keys() and len(ranked[0.0]) == 30
    changed = 0
    for sid in ranked[0.0]:
        by_alpha = {alpha: [h[1] for h in ranked[alpha][sid]] for alpha in ranked}
        assert sorted(by_alpha[0.0]) == sorted(by_alpha[2.0]), sid  # the same hypotheses, re-ranked
        # α = 2's order predicted from α = 0's log-probabilities (which do not depend on α), where no two tie
        predicted = {w: sum(p) / ((5 + len(p)) / 6) ** 2.0 for _, w, p in ranked[0.0][sid]}
        if len({round(v, 2) for v in predicted.values()}) == len(predicted) == len(ranked[0.0][sid]):
            assert by_alpha[2.0] == sorted(predicted, key=predicted.get, reverse=True), sid
        changed += by_alpha[0.0] != by_alpha[2.0]
    assert changed >= 1, "α 0 and 2 rank every n-best list alike: the flag did not reach the generator"


# ---------------------------------------------------------------- the published checkpoints' layout

def published_layout(state):
    """fairseq's checkpoints of 2018 (the published WMT models): the pre-2019 layout and an ``encoder.version`` entry."""
    return dict(pre_2019_layout(state), **{"encoder.version": torch.tensor([2.0])})


def published_checkpoint(path, data, **flags):
    """Write a checkpoint as the published transformer_vaswani_wmt_en_de_big files are: ``args`` (a
    Namespace of the training flags of the time: relu_dropout, lr a float, data a list), no ``cfg``,
    fused attention weights; fairseq's model on ``data``'s dictionaries, ``flags`` over the tiny sizes."""
    from fairseq.data import Dictionary
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

    src, tgt = (Dictionary.load(os.path.join(data, f"dict.{lang}.txt")) for lang in ("src", "tgt"))
    args = Namespace(
        arch="transformer_vaswani_wmt_en_de_big", task="translation", data=[data], source_lang="src",
        target_lang="tgt", encoder_embed_dim=32, encoder_ffn_embed_dim=64, decoder_embed_dim=32,
        decoder_ffn_embed_dim=64, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, share_all_embeddings=True, dropout=0.3,
        attention_dropout=0.1, relu_dropout=0.0, max_source_positions=256, max_target_positions=256,
        criterion="label_smoothed_cross_entropy", label_smoothing=0.1, optimizer="adam", lr=0.0005,
        min_lr=1e-09, lr_scheduler="inverse_sqrt", warmup_updates=4000, max_tokens=3584, seed=1)
    vars(args).update(flags)
    model_args = Namespace(**vars(args))
    ARCH_CONFIG_REGISTRY[args.arch](model_args)
    torch.manual_seed(0)
    model = ARCH_MODEL_REGISTRY["transformer"].build_model(
        model_args, Namespace(source_dictionary=src, target_dictionary=tgt))
    torch.save({"args": args, "model": published_layout(model.state_dict()),
                "optimizer_history": [{"criterion_name": "LabelSmoothedCrossEntropyCriterion",
                                       "optimizer_name": "FairseqAdam", "lr_scheduler_state": {"best": 3.9},
                                       "num_updates": 1000}],
                "extra_state": {"epoch": 3, "batch_offset": 0, "val_loss": 3.9}, "last_optimizer_state": {}},
               path)


def scored_alike(data, theirs, ours):
    """Load both checkpoints with fairseq's loader and compare their log-probabilities of 12 validation
    pairs (to float32 rounding, and not all near zero); returns the two models."""
    models = {}
    for name, path in (("fairseq", theirs), ("ours", ours)):
        ensemble, _, task = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides={"data": data})
        task.load_dataset("valid")
        models[name] = (ensemble[0].eval(), task)
    assert type(models["ours"][0]).__name__ == "VaswaniTransformerModel"
    assert type(models["fairseq"][0]).__name__ == "TransformerModel"
    task = models["fairseq"][1]
    sample = valid_batch(task)
    with torch.no_grad():
        lp = {name: model.get_normalized_probs(model(**sample["net_input"]), log_probs=True)
              for name, (model, _) in models.items()}
    real = sample["target"].ne(task.target_dictionary.pad())
    assert lp["ours"].abs()[real].max() > 1 and (lp["ours"] - lp["fairseq"])[real].abs().max() < 1e-5
    return models["fairseq"][0], models["ours"][0]


def test_published_args_only_checkpoint_converts_and_translates_as_fairseq_does(data_bin, tmp_path):
    """A published-style checkpoint (:func:`published_checkpoint`, the pre-2019 layout):
    fairseq-plugins-convert-transformer converts it; the result gives fairseq's own
    log-probabilities of the file and fairseq-generate's translations of it."""
    published = str(tmp_path / "model.pt")
    published_checkpoint(published, data_bin)
    assert any(k.endswith("self_attn.in_proj_weight") for k in torch.load(published, weights_only=False)["model"])

    converted = str(tmp_path / "converted.pt")
    convert_transformer.main([published, converted])  # the console script's main, in this process
    scored_alike(data_bin, published, converted)
    # plain containers and the options' Namespace: the file loads weights-only, as fairseq's own
    assert torch.load(converted, weights_only=True)["cfg"]["model"].arch == "vaswani_transformer"
    # the scores agree to float32 rounding (as the log-probabilities above), the words and alignments exactly
    out = {name: generate_in_process(tmp_path / name, data_bin, path, "--print-alignment")
           for name, path in (("theirs", published), ("ours", converted))}
    ours, theirs = hypotheses(out["ours"]), hypotheses(out["theirs"])
    assert len(ours) == 30 and ours.keys() == theirs.keys()
    for sid in ours:
        assert [h[1] for h in ours[sid]] == [h[1] for h in theirs[sid]]
        assert [h[0] for h in ours[sid]] == pytest.approx([h[0] for h in theirs[sid]], abs=1e-4)
    alignments = {name: [line for line in text.splitlines() if line.startswith("A-")] for name, text in out.items()}
    assert len(alignments["ours"]) == 30 and alignments["ours"] == alignments["theirs"]


def test_separate_dictionaries_convert_and_score_as_fairseq_does(data_bin_separate, tmp_path):
    """Source and target dictionaries of different sizes, each side its own embeddings and an untied
    output projection: the converter builds each side on its own dictionary's size (the decoder's from
    its embeddings' rows), and the converted model scores as fairseq's."""
    published = str(tmp_path / "model.pt")
    published_checkpoint(published, data_bin_separate, share_all_embeddings=False)
    converted = str(tmp_path / "converted.pt")
    convert_transformer.main([published, converted])
    theirs, ours = scored_alike(data_bin_separate, published, converted)
    sizes = [m.embed_tokens.num_embeddings for m in (ours.encoder, ours.decoder)]
    assert sizes == [theirs.encoder.embed_tokens.num_embeddings, theirs.decoder.embed_tokens.num_embeddings]
    assert sizes[0] != sizes[1]
    assert ours.decoder.output_projection.weight is not ours.decoder.embed_tokens.weight
