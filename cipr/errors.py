"""Errors that name where bad input came from (file, item, field)."""

from __future__ import annotations


class DataError(ValueError):
    """Bad input data: says which file, which item and which field is wrong, and why."""

    def __init__(self, message: str, *, file: str | None = None, item: str | None = None,
                 field: str | None = None) -> None:
        self.file, self.item, self.field, self.reason = file, item, field, message
        where = ", ".join(f"{k} {v!r}" for k, v in (("file", file), ("item", item), ("field", field)) if v)
        super().__init__(f"{where}: {message}" if where else message)
