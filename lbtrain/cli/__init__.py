"""The `lbtrain` command line: one module per verb, each with `add_parser` and `run`."""

__all__: list[str] = []
