"""Recording the fleet's states to a file and replaying them in the console; no Textual here."""
