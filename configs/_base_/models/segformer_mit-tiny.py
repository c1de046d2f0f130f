# A small SegFormer (MiT with 16/32/80/128 channels, one block per stage,
# SegformerHead with D=64) for the offline demo; same structure as B5.
_base_ = ['./segformer_mit-b5.py']
model = dict(
    backbone=dict(embed_dims=16, num_layers=[1, 1, 1, 1],
                  drop_path_rate=0.0),
    decode_head=dict(in_channels=[16, 32, 80, 128], channels=64))
