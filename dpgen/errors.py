"""The one exception type that the CLI turns into a one-line message and exit code 2."""


class DpgenError(Exception):
    """A problem the user can fix: bad config, missing data, corrupt checkpoint, ...

    The message must fit on one line and say what to do about it.
    """
