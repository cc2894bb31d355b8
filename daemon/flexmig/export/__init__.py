"""flexmig.export."""
