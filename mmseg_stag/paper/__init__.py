"""The paper's facts in one place: its scores (``results``), its β0/γ
(``hparams``), its protocol and the baselines' reference settings
(``protocol``), and its tables' layout, checks and figures (``tables``,
what ``tools/collect_results.py`` and ``tools/reproduce.py`` run)."""
