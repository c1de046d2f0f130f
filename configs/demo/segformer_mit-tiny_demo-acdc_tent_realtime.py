# The demo's TENT under the realistic protocol (docs/realtime.md):
# its step's cost pinned, as `tools/demo.py --realtime measure` measured it on
# 2026-12-08 at commit 4ef71aa (2 cores of an Intel Xeon with AVX-512, the
# demo's pinned kernel paths, one thread; median of 21 after 3): a step
# 66.5 ms, a forward 20.6 ms. `tools/demo.py --realtime` runs it.
_base_ = ['./segformer_mit-tiny_demo-acdc_tent.py']
test_cfg = dict(realtime=dict(cost=3.225))
