"""flexmig.plan."""
