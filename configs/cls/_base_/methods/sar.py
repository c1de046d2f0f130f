# SAR (Niu et al., 2023): entropy filter 0.4 ln C, sharpness-aware update,
# model recovery (method defaults).
method = dict(type='sar')
