"""``fairseq-plugins-serve``: translations and alignments over HTTP.

* :mod:`.text`: the preprocessing the model was trained with (fairseq's Moses tokenizer and
  subword-nmt / sentencepiece BPE), so clients send raw text;
* :mod:`.backends`: a checkpoint of any family through fairseq's hub interface, an ONNX folder or a CTranslate2
  folder written by ``fairseq-plugins-export-ctranslate2``;
* :mod:`.batching`: dynamic batching of concurrent requests;
* :mod:`.app`: the Starlette application (``POST /translate``, ``GET /health``, ``GET /info``, the
  page at ``/``) and the uvicorn server.
"""
