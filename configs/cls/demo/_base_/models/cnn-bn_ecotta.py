# The demo's CNN-BN with EcoTTA's K=4 meta networks (one part per
# conv-BN-ReLU layer); CHECKPOINT: its warmed-up file (tools/ecotta_warmup.py
# from the CNN-BN weights, as make demo-cls does).
_base_ = ['./cnn-bn.py']
model = dict(
    network=dict(
        _delete_=True, type='EcoTTANetwork',
        network=dict(type='SmallCNN', norm='BN', width=16), K=4))
