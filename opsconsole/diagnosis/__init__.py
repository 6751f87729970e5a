"""Recognising failures in training logs and saying their cause and remedy; no Textual here."""
