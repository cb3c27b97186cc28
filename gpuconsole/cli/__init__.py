"""The command line: the entry point, the global options, and one module per subcommand."""
