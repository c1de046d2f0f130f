from .continual_metric import (ContinualIoUMetric, append_partial,
                               format_table, write_results)

__all__ = [
    'ContinualIoUMetric', 'append_partial', 'format_table', 'write_results'
]
