"""flexmig.cli."""
