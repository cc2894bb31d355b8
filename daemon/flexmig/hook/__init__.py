"""flexmig.hook."""
