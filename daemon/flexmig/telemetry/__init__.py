"""flexmig.telemetry."""
