# The fast preset of segformer_mit-b5-nvlabs_acdc-continual_cotta-stag.py for
# one CUDA GPU (docs/running.md, "The fast preset"): the same method, data,
# protocol and metric; bfloat16 autocast around the forward passes, MiT
# attention through SDPA on channels-last views of the tokens, the restore mask
# drawn on the GPU, the teacher's views of one size as one batch (its labels
# can differ where two classes tie: docs/methods.md), each step replayed as a
# CUDA graph (kept across stages: the optimizer restarts in place), 8
# loader workers. Without CUDA the run stops before the stream.
_base_ = ['./segformer_mit-b5-nvlabs_acdc-continual_cotta-stag.py']
model = dict(backbone=dict(attention='sdpa', token_maps='view'))
# 1920x1080 PNG decoding on the H100 machine: 2 workers 19.1-21.6 images/s, 8
# workers 79.3-88.9 (docs/results/gpu/2026-11-27-h100*/): above the graphed step
test_dataloader = dict(num_workers=8)
# the restore mask drawn on the GPU (a graph replays no host draw) and the
# teacher's views of one size batched: cotta_fast in the step figures
test_cfg = dict(preset='fast', mixed_precision='bf16', cuda_graph=True,
                method=dict(restore_on_device=True, batch_views=True))
