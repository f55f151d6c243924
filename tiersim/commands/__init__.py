"""One module per subcommand; each takes parsed arguments and returns an exit code."""
