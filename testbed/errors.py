"""Errors that are the user's to fix: the CLI prints them as one line and exits with code 2."""


class UserError(Exception):
    """Bad input from a person: a config file, a command-line argument, a missing path."""


class ConfigError(UserError):
    """A scenario or config file that cannot be read; the message names the file and field/line."""
