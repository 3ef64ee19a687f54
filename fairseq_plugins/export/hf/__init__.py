"""Write a fairseq-plugins checkpoint as a Hugging Face transformers model folder.

    fairseq-plugins-export-hf CHECKPOINT OUT_DIR [--data DIR] [--force]
        [--bpe-codes FILE | --sentencepiece-model FILE] [--source-lang L] [--target-lang L]
        [--beam N] [--max-len-a A] [--max-len-b B] [--lenpen P]

Interface between the shared part (this package) and the model writers
-----------------------------------------------------------------------
``export(checkpoint, out_dir, data=None, force=False, bpe_codes=None, sentencepiece_model=None,
source_lang=None, target_lang=None, beam=5, max_len_a=0.0, max_len_b=200, lenpen=1.0)``:

1. refuses bad input with one-line :mod:`fairseq_plugins.errors` errors BEFORE writing anything
   (OUT_DIR exists without ``force``; unreadable checkpoint; another architecture; missing
   dictionary / ``--data``; missing BPE codes or sentencepiece model);
2. loads the model with fairseq's ``checkpoint_utils.load_model_ensemble_and_task`` on the state
   read by the suite's loader (:func:`fairseq_plugins.checkpoints.load_state`), eval mode;
3. dispatches by model family (``ARCH_MODEL_NAME_REGISTRY[arch]``):

   * ``vaswani_transformer`` -> :mod:`fairseq_plugins.export.hf.transformer`;
   * ``rnnsearch``, ``rnnencdec``, ``seq2seq_lstm`` -> :mod:`fairseq_plugins.export.hf.rnn`.

   A family module has exactly two functions:

   * ``check_supported(model) -> None``: raises a one-line ``ConfigError`` naming the option
     it cannot export; called before anything is written;
   * ``write_model(model, out_dir) -> None``: ``out_dir`` is an existing empty staging folder;
     writes ``config.json`` (with ``auto_map`` for remote code), ``model.safetensors`` and any
     modeling ``.py`` files. ``config.json`` must carry the TARGET dictionary's special ids:
     ``pad_token_id = tgt_dict.pad()`` (1), ``eos_token_id = tgt_dict.eos()`` (2),
     ``bos_token_id = tgt_dict.bos()`` (0), ``decoder_start_token_id = tgt_dict.eos()``
     (fairseq starts decoding from ``</s>``), ``is_encoder_decoder = True``, and the model must
     take ``input_ids`` of SOURCE dictionary ids ending with ``</s>`` (as fairseq's sources do),
     ``attention_mask`` 1 on tokens, and return logits over the target dictionary in its order.
     It must not write ``generation_config.json`` or tokenizer files (the shared part does,
     after ``write_model``, overwriting whatever is there).

4. writes, for every family, ``generation_config.json`` (fairseq-generate's beam, max length
   a*src_len+b, length penalty, its stopping rule) and the tokenizer files (same id = same token
   as fairseq's dictionaries; preprocessing from the files named: sacremoses [+ subword-nmt BPE
   codes] or a sentencepiece model);
5. moves the staging folder to ``out_dir`` (replacing it only with ``force``).
"""
