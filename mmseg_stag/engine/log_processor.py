"""A ``LogProcessor`` that also prints the test loop's scalars."""
from mmengine.registry import LOG_PROCESSORS
from mmengine.runner import LogProcessor

#: keys MMEngine already formats in the log line's header
_HEADER_KEYS = ('time', 'data_time', 'iter', 'memory')


@LOG_PROCESSORS.register_module()
class OnlineAdaptationLogProcessor(LogProcessor):
    """Log processor that also prints the online loop's ``test/`` scalars
    and its images per second."""

    def get_log_after_iter(self, runner, batch_idx, mode):
        tag, log_str = super().get_log_after_iter(runner, batch_idx, mode)
        if mode == 'test':
            items = [f'{key}: {value:.{self.num_digits}f}'
                     if isinstance(value, float) else f'{key}: {value}'
                     for key, value in tag.items()
                     if key.split('/')[-1] not in _HEADER_KEYS]
            seconds = tag.get('time')  # IterTimerHook's, over the window
            batch_size = getattr(getattr(getattr(
                runner, 'test_loop', None), 'dataloader', None),
                'batch_size', None)
            if seconds and batch_size:
                # the whole loop's rate (loader, step, metric), the unit of
                # the benchmarks (docs/benchmark.md)
                items.insert(0, f'images/s: {batch_size / seconds:.2f}')
            log_str += '  '.join(items)
        return tag, log_str
