"""The generative framework (Ozkara, Girgis, Data and Diggavi): its experiments and checks.

"A Generative Framework for Personalized Learning and Estimation: Theory,
Algorithms, and Privacy" is the paper the library's estimation core implements:
empirical Bayes under a population prior (:mod:`ebfl.eb`), quantized and private
estimators (:mod:`ebfl.privacy`), the bounds (:mod:`ebfl.bounds`). What is the
paper's own, beyond that core, is here:

* :mod:`ebfl.generative.algorithm`: AdaPeD and DP-AdaPeD, in torch (imported only
  when used: ``pip install 'ebfl[learning]'``); DP-AdaPeD's accountant and the
  paper's Theorem 7 are in :mod:`ebfl.privacy.accounting.adaped`;
* :mod:`ebfl.generative.checks`: one Monte Carlo check per theorem (``ebfl validate``);
* the reproductions: :mod:`~ebfl.generative.estimation` (E1, E8),
  :mod:`~ebfl.generative.election` (E2, the county elections),
  :mod:`~ebfl.generative.regression` (E3), :mod:`~ebfl.generative.hapt`
  (personalized logistic regression on 30 users), :mod:`~ebfl.generative.adaped`
  (Table 1, Figures 1-3) and :mod:`~ebfl.generative.adaped_protocol` (Table 1's
  tuning protocol).
"""

__all__: list[str] = []
