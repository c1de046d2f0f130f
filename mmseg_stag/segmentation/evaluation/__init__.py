from .continual_metric import ContinualIoUMetric
from .continual_report import (append_partial, format_table, stage_result,
                               write_results)

__all__ = ['ContinualIoUMetric', 'append_partial', 'format_table',
           'stage_result', 'write_results']
