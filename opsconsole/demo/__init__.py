"""`opsconsole demo`: a real small training run that fails, and the console on it."""
