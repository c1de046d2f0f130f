# CoTTA (Wang et al., 2022): EMA teacher, augmentation-averaged pseudo
# labels, stochastic restore (method defaults).
method = dict(type='cotta')
