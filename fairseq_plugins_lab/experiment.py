"""Small experiment driver shared by the quickstart and the paper-claims experiment.

Each step runs fairseq's (or the suite's) command-line tool in a subprocess, keeps its log
next to its output, and is skipped when that output already exists, so an interrupted run
continues where it stopped.
"""
import concurrent.futures
import json
import os
import subprocess
import sys
import time

import sacrebleu

import fairseq_plugins
from fairseq_plugins.analysis.generate_output import read_generate
from fairseq_plugins.checkpoints import UPDATE_PATTERN, average_states, averaging_window, save_state
from fairseq_plugins.data.synthetic_corpus import preprocess_args, write_corpus

USER_DIR = os.path.dirname(os.path.abspath(fairseq_plugins.__file__))  # what --user-dir loads
BIN = os.path.dirname(sys.executable)


def small_adam_recipe(lr, max_tokens, label_smoothing=0.0, warmup_updates=None):
    """fairseq-train flags of the small CPU runs (quickstart, memory soak, paper claims).

    Adam instead of the papers' Adadelta/SGD: with minutes, not days, of training it is the
    only optimiser with which every model learns enough to compare. ``warmup_updates`` adds the
    inverse-square-root warm-up (the Transformer's); label smoothing 0 is plain NLL.
    """
    flags = ["--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--clip-norm", "1.0", "--lr", lr,
             "--criterion", "label_smoothed_xent", "--label-smoothing", label_smoothing, "--max-tokens", max_tokens]
    if warmup_updates:
        flags += ["--lr-scheduler", "inverse_sqrt_warmup", "--warmup-updates", warmup_updates]
    return [str(f) for f in flags]


def say(message):
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def run(cmd, log_path=None, echo=(), prefix=""):
    """Run a CLI; keep its output in ``log_path``; echo the lines that contain one of ``echo``.

    ``prefix`` starts every echoed line (which run it came from, when runs go in parallel).
    """
    env = dict(os.environ, PATH=BIN + os.pathsep + os.environ.get("PATH", ""))
    log = open(log_path, "w", buffering=1) if log_path else None  # line by line: the log shows where a run is
    proc = subprocess.Popen([str(c) for c in cmd], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    tail = []
    for line in proc.stdout:
        if log:
            log.write(line)
        tail = (tail + [line])[-20:]
        if any(marker in line for marker in echo):
            print("    " + prefix + line.rstrip().split(" | ", 2)[-1], flush=True)
    if log:
        log.close()
    if proc.wait() != 0:
        sys.exit(f"error: {cmd[0]} failed (exit {proc.returncode}); last lines:\n{''.join(tail)}")


def make_corpus(raw, **flags):
    """The embedded corpus in ``raw`` (``write_corpus``'s keyword arguments), unless it is there."""
    if not os.path.exists(os.path.join(raw, "test.tgt")):
        say(f"generating the embedded corpus in {raw}")
        write_corpus(raw, **flags)
    return raw


def preprocess(raw, data, trainpref=None, dictionaries_from=None):
    """fairseq-preprocess with a joined dictionary, or the dictionaries of another data-bin."""
    if not os.path.exists(os.path.join(data, "test.src-tgt.tgt.idx")):
        say(f"fairseq-preprocess -> {data}")
        # With --joined-dictionary fairseq takes the one dictionary from --srcdict.
        srcdict = f"{dictionaries_from}/dict.src.txt" if dictionaries_from else None
        run(["fairseq-preprocess", *preprocess_args(raw, data, trainpref=trainpref, srcdict=srcdict, workers=2)],
            f"{data}.preprocess.log")
    return data


def count_parameters(checkpoint):
    from fairseq_plugins.checkpoints import load_state

    seen, total = set(), 0
    for tensor in load_state(checkpoint)["model"].values():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if key not in seen:  # tied embeddings are stored once
            seen.add(key)
            total += tensor.numel()
    return total


def run_parallel(tasks, jobs):
    """Call every function of ``tasks`` (each runs its own subprocesses), ``jobs`` at a time.

    Returns their results in order; the first failure stops the run once the running ones end.
    """
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(task) for task in tasks]
        try:
            return [future.result() for future in futures]
        except BaseException:
            for future in futures:
                future.cancel()
            raise


def device_flags(device):
    """fairseq's flags for ``device``: ``cpu`` or ``cuda`` (fairseq takes the GPU unless told --cpu)."""
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device {device!r}: expected cpu or cuda")
    return ["--cpu"] if device == "cpu" else []


def generate(data, checkpoint, out, extra=(), device="cpu"):
    if not os.path.exists(out):
        run(["fairseq-generate", data, "--user-dir", USER_DIR, "--path", checkpoint, "--gen-subset", "test",
             "--beam", 4, "--batch-size", 64, *device_flags(device), "--max-len-a", 1, "--max-len-b", 10, *extra],
            out + ".tmp")
        os.replace(out + ".tmp", out)
    return out


def score(gen):
    entries = read_generate(gen)
    hyps, refs = [e.output for e in entries], [e.ref for e in entries]
    return {"bleu": round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2),
            "chrf": round(sacrebleu.corpus_chrf(hyps, [refs]).score, 2), "sentences": len(entries)}


def updates_done(checkpoint):
    from fairseq_plugins.checkpoints import load_state

    return load_state(checkpoint)["optimizer_history"][-1]["num_updates"]


def validate(data, checkpoint, log_path, device="cpu"):
    """Validation loss, NLL (base 2) and perplexity of ``checkpoint`` (fairseq-validate)."""
    run(["fairseq-validate", data, "--user-dir", USER_DIR, "--task", "translation", "--path", checkpoint,
         "--valid-subset", "valid", "--max-tokens", 4096, *device_flags(device), "--num-workers", 0], log_path)
    return best_valid(log_path)


def best_valid(train_log):
    """Lowest validation loss and NLL (base 2) logged by fairseq-train, with the perplexity."""
    best = None
    with open(train_log) as f:
        for line in f:
            if " | valid | " in line and " nll_loss " in line:
                fields = line.split(" | ")
                values = dict(field.strip().split(" ", 1) for field in fields if field.strip().count(" ") == 1)
                record = {k: float(values[k]) for k in ("loss", "nll_loss", "ppl") if k in values}
                if best is None or record["nll_loss"] < best["nll_loss"]:
                    best = record
    return best


def train_and_evaluate(work, name, data, train_flags, max_update, minutes, average=5, score_last=False,
                       seed=1, save_points=30, validate_scored=False, echo=True, generate_flags=(),
                       validate_last_only=False, keep_all=False, device="cpu"):
    """Train ``name`` with fairseq-train, average the last checkpoints, translate and score.

    A checkpoint is written every ``max_update / save_points`` updates and the last ``average``
    of them are averaged, taken only from the same share of the updates done (a run stopped on
    the ``minutes`` limit averages fewer; ``result["stopped_on_time"]``). With ``score_last`` the
    last checkpoint is translated and scored too (``result["last"]``); with ``validate_scored`` the
    scored checkpoint's validation loss and perplexity are measured (``result["scored_valid"]``;
    ``result["valid"]`` is the best one logged during training). ``generate_flags`` go to every fairseq-generate (e.g. --remove-bpe).
    fairseq-train validates at every checkpoint; with ``validate_last_only`` only at the ones
    averaged (and at the end), which on a small budget saves most of the time. ``keep_all`` keeps
    every interval checkpoint (to pick one by time or compute later) and does not validate: fairseq
    saves an interval checkpoint only from --validate-after-updates on, and the times of a run that
    validates count the validations (``result["valid"]`` is then None).
    """
    out = os.path.join(work, name)
    result_path = os.path.join(out, "result.json")
    if os.path.exists(result_path):
        say(f"{name}: done before, skipping (delete {out} to redo)")
        with open(result_path) as f:
            return json.load(f)
    os.makedirs(out, exist_ok=True)
    ckpt = os.path.join(out, "checkpoints")
    say(f"{name}: fairseq-train, {max_update} updates or {minutes:g} minutes, seed {seed}")
    start = time.time()
    interval = max(1, max_update // save_points)
    run(["fairseq-train", data, "--user-dir", USER_DIR, *train_flags, *device_flags(device),
         "--max-update", max_update, "--stop-time-hours", minutes / 60, "--save-dir", ckpt,
         "--save-interval-updates", interval,
         "--keep-interval-updates", -1 if keep_all else max(1, average), "--no-epoch-checkpoints", "--no-progress-bar",
         "--log-interval", max(1, max_update // 30), "--seed", seed, "--num-workers", 0,
         *(["--disable-validation"] if keep_all else ["--validate-after-updates", max(
             0, max_update - average * interval) if validate_last_only else 0])],
        os.path.join(out, "train.log"), echo=(" | train_inner | ", " | valid | ") if echo else (),
        prefix=f"{name}: ")
    train_minutes = (time.time() - start) / 60
    updates = updates_done(os.path.join(ckpt, "checkpoint_last.pt"))
    stopped_on_time = updates < max_update
    if stopped_on_time:
        say(f"{name}: stopped on the {minutes:g}-minute time limit at update {updates} of {max_update}")
    # The average spans the same share of the training done as it would of the whole budget.
    chosen = averaging_window(ckpt, average, updates, min(1.0, average * interval / max_update)) if average else []
    evaluated = os.path.join(out, "average.pt")
    if chosen:
        say(f"{name}: averaging {len(chosen)} checkpoints (updates "
            f"{', '.join(UPDATE_PATTERN.match(os.path.basename(c)).group(1) for c in chosen)}), "
            "then fairseq-generate (beam 4)")
        # in this process: one interpreter start less per run (fairseq-plugins-average does the same)
        save_state(average_states(chosen), evaluated)
    else:  # nothing to average, or no interval checkpoint in the last part of the training done
        say(f"{name}: fairseq-generate (beam 4) on the last checkpoint")
        evaluated = os.path.join(ckpt, "checkpoint_last.pt")
    result = {"model": name, "seed": seed, "parameters": count_parameters(evaluated),
              "train_minutes": round(train_minutes, 1), "averaged": len(chosen), "checkpoint": evaluated,
              "updates": updates, "max_update": max_update, "stopped_on_time": stopped_on_time,
              **score(generate(data, evaluated, os.path.join(out, "generate.txt"), generate_flags, device)),
              "valid": best_valid(os.path.join(out, "train.log"))}
    if validate_scored:
        result["scored_valid"] = validate(data, evaluated, os.path.join(out, "validate.log"), device)
    if score_last:
        result["last"] = score(generate(data, os.path.join(ckpt, "checkpoint_last.pt"),
                                        os.path.join(out, "generate-last.txt"), generate_flags, device))
    with open(result_path, "w") as f:
        json.dump(result, f)
    return result
