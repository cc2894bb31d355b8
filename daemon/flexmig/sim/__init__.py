"""flexmig.sim."""
