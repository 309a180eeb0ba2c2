"""The command line: thin; parses, calls a stage, renders. One module per group of verbs."""
