"""Following log files (local and over SSH) and labelling their lines; no Textual here."""
