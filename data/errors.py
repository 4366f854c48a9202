"""The one exception of the data package."""


class DataError(Exception):
    """Bad input data or data config; the message is one line that names the file or key and says what to do."""
