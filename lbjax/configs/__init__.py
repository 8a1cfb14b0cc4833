"""The experiment configs shipped with lbjax: `lbjax-train --config mnist_lstm`, `lbjax-train --list`.

Each module is a config of the shape `lbjax.train.config_files` describes: `get_config()`, the
`VARIANTS` it understands and, where settings follow from others, `finalize(config, presets)`.
"""
