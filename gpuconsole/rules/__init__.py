"""What a reading means: the thresholds, the findings of one snapshot, per-host aggregates."""
