"""The one exception type for mistakes a user can fix."""


class StereoError(Exception):
    """Bad input or options. The message says what is wrong and what to do.

    The CLI prints it as one line on stderr and exits with status 2.
    """
