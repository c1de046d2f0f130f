from .continual_metric import ContinualIoUMetric, format_table, write_results

__all__ = ['ContinualIoUMetric', 'format_table', 'write_results']
