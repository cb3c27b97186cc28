"""The console's screens: fleet, host, topology and help."""
