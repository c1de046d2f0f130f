"""Checks of a method's numeric options, with the option named."""


def check_range(relation: str, **values) -> None:
    """Raise ``ValueError`` for the first of ``values`` (by name) that is
    not ``relation``: ``'> 0'``, ``'>= 0'`` or ``'in [0, 1]'``."""
    holds = {'> 0': lambda v: v > 0, '>= 0': lambda v: v >= 0,
             'in [0, 1]': lambda v: 0.0 <= v <= 1.0}[relation]
    for name, value in values.items():
        if not holds(value):
            raise ValueError(f'{name} must be {relation}, got {value}')
