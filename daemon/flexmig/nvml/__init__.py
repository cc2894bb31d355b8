"""flexmig.nvml."""
