# Source: the model is evaluated as it is, no adaptation.
test_cfg = dict(type='OnlineAdaptationLoop', method=dict(type='source'))
