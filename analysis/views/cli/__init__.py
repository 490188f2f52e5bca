"""The analysis commands of ``headsweep``: ``commands.register`` adds them to the main parser."""
