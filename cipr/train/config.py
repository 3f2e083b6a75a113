"""The training configs' loader: `cipr.config` (one strict loader for every command), re-exported here."""

from cipr.config import ConfigError, from_dict, to_dict

__all__ = ["ConfigError", "from_dict", "to_dict"]
