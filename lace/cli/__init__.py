"""lace.cli: the ``lace`` command line — ``main(argv, env) -> ExitStatus`` and its commands."""
