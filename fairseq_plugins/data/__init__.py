"""Corpora: the embedded synthetic language pair, Moses-style text preparation, and a real
language pair from the gettext catalogs installed on the machine (catalogs.py)."""
