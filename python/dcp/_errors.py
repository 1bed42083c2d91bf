"""The package's one exception type: the engine's DcpError, raised from Python code too."""

from ._dcp import DcpError


def invalid_argument(message: str) -> DcpError:
    """A DcpError for a bad argument found before the engine runs."""
    err = DcpError(message)
    err.code = "INVALID_ARGUMENT"
    return err
