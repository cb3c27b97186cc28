"""The fleet session and what it owns: the store, the polling round, the alert engine,
the recorder, and the views of the fleet that screens and subcommands share."""
