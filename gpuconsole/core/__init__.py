"""What every layer shares: the model, the field table, the boundary for untrusted data,
paths, clocks, the audit log and the XID table."""
