"""The training configs' loader: `cipr.core.config` (one strict loader for every command), re-exported here."""

from cipr.core.config import ConfigError, from_dict, to_dict

__all__ = ["ConfigError", "from_dict", "to_dict"]
