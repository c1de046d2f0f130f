# Source: the model as trained, no adaptation (BatchNorm with its running
# statistics).
test_cfg = dict(type='OnlineAdaptationLoop', method=dict(type='source'))
