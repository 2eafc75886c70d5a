"""The one exception type for mistakes a user can fix."""


class StereoError(Exception):
    """Bad input or options. The message says what is wrong and what to do.

    The CLI prints it as one line on stderr and exits with status 2.
    """


def raise_interrupt(e: BaseException) -> None:
    """Ctrl-C that lands inside a Numba-compiled call comes out as a SystemError whose
    context is the KeyboardInterrupt: raise that, so it stops the work like any Ctrl-C
    instead of passing for an error of the input."""
    while e is not None:
        if isinstance(e, KeyboardInterrupt):
            raise KeyboardInterrupt from None
        e = e.__cause__ or e.__context__
