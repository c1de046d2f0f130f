# DeYO (Lee et al., 2024): entropy filter 0.5 ln C, PLPD filter with patch
# shuffling (method defaults).
method = dict(type='deyo')
