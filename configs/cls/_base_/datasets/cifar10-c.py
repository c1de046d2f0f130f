# CIFAR-10-C as released: <data_root>/<corruption>.npy (5 severities x
# 10,000 uint8 HWC images) and labels.npy; [0, 1] inputs (RobustBench);
# error % in the tables.
_base_ = ['./corruption_stream.py']
test_dataloader = dict(
    batch_size=200,
    dataset=dict(
        corruption_set=dict(
            type='CIFARC', data_root='data/CIFAR-10-C', severity=5,
            n_examples=10000),
        scenario=dict(type='continual')))
test_evaluator = dict(table_metric='err')
