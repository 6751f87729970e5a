"""Incident reports: collect what the console knows into one shareable tar.gz; no Textual."""
