"""Deployment routes: CTranslate2 for the Transformer, ``torch.export`` for every family."""
