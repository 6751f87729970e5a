"""Health checks over frames, telemetry findings and on-node GPU sanity tests; no Textual here."""
