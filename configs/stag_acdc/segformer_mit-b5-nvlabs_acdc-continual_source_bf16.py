# The fast preset of segformer_mit-b5-nvlabs_acdc-continual_source.py for one
# CUDA GPU (docs/running.md, "The fast preset"): the same method, data,
# protocol and metric; bfloat16 autocast around the forward passes, MiT
# attention through SDPA on channels-last views of the tokens, steps eager, 8
# loader workers. Without CUDA the run stops before the stream.
_base_ = ['./segformer_mit-b5-nvlabs_acdc-continual_source.py']
model = dict(backbone=dict(attention='sdpa', token_maps='view'))
# 1920x1080 PNG decoding on the H100 machine: 2 workers 19.1-21.6 images/s, 8
# workers 79.3-88.9 (docs/results/gpu/2026-11-27-h100*/): above the graphed step
test_dataloader = dict(num_workers=8)
# steps eager: no step figure shows a CUDA graph pays for this method
# (docs/running.md), so this preset has none (and no _graph in its name)
test_cfg = dict(preset='fast', mixed_precision='bf16')
