"""Alert rules over live readings, health results and log findings; hooks that deliver them. No Textual."""
