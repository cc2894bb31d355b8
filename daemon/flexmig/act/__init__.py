"""flexmig.act."""
