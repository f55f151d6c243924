"""One module per subcommand. Each declares ``COMMAND`` (a :class:`tiersim.command.Command`: its name, help,
flags and run function); ``tiersim.cli.COMMANDS`` lists them and dispatches."""
