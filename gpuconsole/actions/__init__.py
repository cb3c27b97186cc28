"""Actions: what the console does to hosts, each shown before it runs and logged after."""
