# Runtime of tools/test_cls.py (see mmseg_stag/classification/experiment.py).
rows = ['base', 'stag']  # any of 'source', 'base', 'stag'
bn_batch_stats = True  # adapted models use test-batch BN statistics
seed = 1
device = 'cpu'
num_workers = 2  # batches prefetched by DataLoader workers
log_interval = 50  # also log every N batches (0: once per corruption)
