"""``pipeline("translation")`` for the models exported by ``fairseq-plugins-export-hf``.

transformers 5 removed its translation pipeline; an exported folder names this one in
``config.json`` (``custom_pipelines``), so ``pipeline("translation", model=DIR,
trust_remote_code=True)`` translates raw text with the model's generation_config.json, as the
old pipeline did: ``translate("text") == [{"translation_text": ...}]``, a list of texts gives a
list of those dicts.
"""
from transformers import Pipeline


class TranslationPipeline(Pipeline):
    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _load_tokenizer = True

    def _sanitize_parameters(self, **generate_kwargs):
        return {}, generate_kwargs, {}

    def __call__(self, inputs, **kwargs):
        result = super().__call__(inputs, **kwargs)
        if isinstance(inputs, (list, tuple)):
            return [r[0] for r in result]  # one dict per text, as the old pipeline returned
        return result

    def preprocess(self, text):
        return self.tokenizer([text], return_tensors="pt")  # [1, S]: the text's ids, then </s>

    def _forward(self, model_inputs, **generate_kwargs):
        return {"output_ids": self.model.generate(**model_inputs, **generate_kwargs)}  # [1, T]

    def postprocess(self, model_outputs):
        return [{"translation_text": self.tokenizer.decode(model_outputs["output_ids"][0], skip_special_tokens=True)}]
