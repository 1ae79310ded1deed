"""Config spaces and points (defined in `ember.te.config`, below the templates that read them)."""

from ember.te.config import (
    CONFIG_ATTR,
    ConfigBase,
    ConfigEntity,
    ConfigError,
    ConfigSpace,
    Knob,
    as_config,
)

__all__ = ["CONFIG_ATTR", "ConfigBase", "ConfigEntity", "ConfigError", "ConfigSpace", "Knob", "as_config"]
