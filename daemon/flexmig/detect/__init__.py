"""flexmig.detect."""
