"""The package's one exception type: the engine's DcpError, raised from Python code too."""

from ._dcp import DcpError


def error(code: str, message: str) -> DcpError:
    """A DcpError with the engine's code spelling ("INVALID_ARGUMENT", "UNAVAILABLE", ...)."""
    err = DcpError(message)
    err.code = code
    return err


def invalid_argument(message: str) -> DcpError:
    """A DcpError for a bad argument found before the engine runs."""
    return error("INVALID_ARGUMENT", message)
