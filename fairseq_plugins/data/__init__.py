"""Corpora: the embedded synthetic language pair, and Moses-style text preparation."""
