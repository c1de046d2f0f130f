# Source: the model is evaluated as it is, no adaptation.
custom_hooks = [dict(type='TTAHook', method='source')]
